import os

# Tests never reach the Hugging Face hub; loaders must take the offline path.
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
