"""The paper's model: exactly the files a saved model folder carries as remote code. They import only torch,
transformers, huggingface_hub (a dependency of transformers) and safetensors (and each other), and keep no process
state."""
