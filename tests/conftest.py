import os, sys
from pathlib import Path

# Tests never reach the Hugging Face hub; loaders must take the offline path.
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import build_docs  # noqa: E402  (tools/ is not a package)


def pytest_collection_modifyitems(config, items):
    "Run the docs-site tests last: they reuse the chapters the notebook tests executed."
    items.sort(key=lambda it: it.get_closest_marker("docs") is not None)
