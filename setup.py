"""Package layout for the one `taskherd` distribution (metadata lives in pyproject.toml).

`worker/` holds `taskherd` (with `taskherd.worker` and shared modules such as `taskherd.queues`);
`operator/` holds `taskherd.operator`. The extra directory level means `operator/` never contains an
`__init__.py`, so it can never shadow the standard library's `operator` when the repository root
is on sys.path (python -c, python -m from the checkout).
"""
from setuptools import find_namespace_packages, find_packages, setup

worker_packages = find_packages("worker", include=["taskherd", "taskherd.*"])
operator_packages = find_namespace_packages("operator", include=["taskherd.operator", "taskherd.operator.*"])

setup(
    packages=worker_packages + operator_packages,
    package_dir={"": "worker", **{p: "operator/" + p.replace(".", "/") for p in operator_packages}},
    package_data={"taskherd.operator": ["crd/*.yaml"]},
)
