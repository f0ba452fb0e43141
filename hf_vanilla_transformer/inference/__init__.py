"""Using a trained model: loading, translation and evaluation, int8 layers and the opt-in CPU speed step."""
