"""The chart as it is published: `helm package` gives a versioned archive without the development
files, and Chart.yaml carries what Artifact Hub shows (links, CRD, an example that the CRD accepts)."""
from __future__ import annotations

import tarfile

import yaml

from chart_support import CHART, helm
from test_render import _unknown_fields

META = yaml.safe_load((CHART / "Chart.yaml").read_text())


def test_helm_package_gives_a_versioned_archive_without_development_files(tmp_path):
    helm("package", str(CHART), "--destination", str(tmp_path))
    archive = tmp_path / f"taskherd-{META['version']}.tgz"
    assert archive.exists()
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert "taskherd/Chart.yaml" in names and "taskherd/values.schema.json" in names
    assert "taskherd/crds/workerpools.taskherd.io.yaml" in names
    assert not [n for n in names if n.startswith(("taskherd/hack/", "taskherd/.checkov"))]


def test_chart_metadata_points_at_the_project_and_describes_the_crd():
    assert META["home"] == "https://github.com/taskherd/taskherd"
    assert META["sources"] == ["https://github.com/taskherd/taskherd"]
    notes = META["annotations"]
    (crd,) = yaml.safe_load(notes["artifacthub.io/crds"])
    assert crd["name"] == "workerpools.taskherd.io" and crd["kind"] == "WorkerPool"
    schema = yaml.safe_load((CHART / "crds" / "workerpools.taskherd.io.yaml").read_text())
    version = next(v for v in schema["spec"]["versions"] if v["name"] == crd["version"])
    spec_schema = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for example in yaml.safe_load(notes["artifacthub.io/crdsExamples"]):
        assert _unknown_fields(example["spec"], spec_schema, "spec") == []
        assert set(spec_schema["required"]) <= set(example["spec"])
    assert {link["name"] for link in yaml.safe_load(notes["artifacthub.io/links"])} >= {"Chart documentation"}
