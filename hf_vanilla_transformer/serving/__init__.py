"""Serving a model folder over HTTP (`hf-vanilla-transformer serve`): app.py (the API, the page, `serve`),
batching.py (dynamic batching), engine.py (the model side), options.py (`ServeOptions`). The server needs the
`serve` extra (FastAPI, uvicorn); `ServeOptions` does not, so the command line builds `serve --help` without it:
the server's names are imported when first used (PEP 562)."""

from __future__ import annotations

import importlib
from typing import Any

from .options import ServeOptions

# The server's names, by the module that defines them.
_SERVER = {
    "DynamicBatcher": "batching",
    "Item": "batching",
    "Limits": "app",
    "QueueFullError": "batching",
    "ServingModel": "engine",
    "ShuttingDownError": "batching",
    "create_app": "app",
    "http_server": "app",
    "load_serving_model": "app",
    "serve": "app",
}


def __getattr__(name: str) -> Any:
    """A name of the server, from its module; an ImportError naming the extra where FastAPI or uvicorn is missing."""
    if name not in _SERVER:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as error:  # an optional extra: only serving needs it
        raise ImportError("Serving needs FastAPI and uvicorn: pip install 'hf_vanilla_transformer[serve]'.") from error
    return getattr(importlib.import_module(f".{_SERVER[name]}", __name__), name)


__all__ = ["ServeOptions", *_SERVER]
