import os, sys
from pathlib import Path

# Tests never reach the Hugging Face hub; loaders must take the offline path.
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Property tests are reproducible: the same examples on every run and machine (derandomize), nothing written into the
# checkout (no example database, so no failure is silently replayed from .hypothesis/), no timing flakiness.
# HYPOTHESIS_PROFILE=explore draws fresh random examples, for a local hunt for bugs.
from hypothesis import settings, HealthCheck  # noqa: E402

settings.register_profile("ci", derandomize=True, database=None, deadline=None, max_examples=50, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("explore", database=None, deadline=None, max_examples=200)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import build_docs  # noqa: E402  (tools/ is not a package)


def pytest_collection_modifyitems(config, items):
    "Run the docs-site tests last: they reuse the chapters the notebook tests executed."
    items.sort(key=lambda it: it.get_closest_marker("docs") is not None)
