"""Serving a model folder over HTTP (`hf-vanilla-transformer serve`): app.py (the API, the page, `serve`),
batching.py (dynamic batching), engine.py (the model side). Needs the `serve` extra (FastAPI, uvicorn)."""

try:
    import fastapi  # noqa: F401
    import uvicorn  # noqa: F401
except ImportError as error:  # an optional extra: only serving needs it
    raise ImportError("Serving needs FastAPI and uvicorn: pip install 'hf_vanilla_transformer[serve]'.") from error

from .app import Limits, ServeOptions, create_app, http_server, load_serving_model, serve
from .batching import DynamicBatcher, Item, QueueFullError, ShuttingDownError
from .engine import ServingModel

__all__ = [
    "DynamicBatcher",
    "Item",
    "Limits",
    "QueueFullError",
    "ServeOptions",
    "ServingModel",
    "ShuttingDownError",
    "create_app",
    "http_server",
    "load_serving_model",
    "serve",
]
