"""The layering of docs/ARCHITECTURE.md holds (every import points down, no command imports
another, no driver imports another, nothing imports the package root) and no function is left
that nothing calls (tests/layering.py reads the source)."""

import pytest

from layering import (LAYERS, ROOT, arrows_against_layers, back_arrows, dead_functions,
                      imports_of, layer_of, module_name, package_files, root_importers)


def test_every_import_points_down_the_layers():
    assert back_arrows() == []


def test_nothing_imports_the_package_root():
    """simsp/__init__.py's facade imports simsp.api lazily; importing the root from below would
    close a circle (root -> api -> explore -> root): __version__ is read from simsp/version.py."""
    assert root_importers() == []


def test_an_import_of_the_root_is_seen(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import simsp\nfrom simsp import __version__\nfrom simsp import units\n")
    assert imports_of(module) == {"simsp", "simsp.units"}


def test_every_function_is_called_from_the_package_or_a_benchmark():
    assert dead_functions() == []


@pytest.mark.parametrize("source, target", [
    ("simsp.engine.network", "simsp.report.run.trace.writer"),  # engine must not know reports
    ("simsp.scenario.config", "simsp.training.driver.iteration"),
    ("simsp.commands.search", "simsp.commands.sweep"),  # commands are peers
    ("simsp.validation.runner", "simsp.explore.evaluation.limits"),  # drivers are peers
    ("simsp.calibrate.fit", "simsp.validation.quantities"),
    ("simsp.report.whatif.page", "simsp.explore.whatif"),  # reports format, drivers run
])
def test_a_new_back_arrow_is_caught(source, target):
    assert arrows_against_layers(source, [target]) == [f"{source} -> {target}"]


def test_downward_and_same_layer_imports_pass():
    assert arrows_against_layers("simsp.report.run.summary_md", [
        "simsp.metrics", "simsp.units", "simsp.report.run.figures.drawing"]) == []


def test_a_driver_imports_its_own_modules_and_lower_layers():
    assert arrows_against_layers("simsp.explore.search.bounds", [
        "simsp.explore.configs.grid", "simsp.explore.evaluation.cache", "simsp.metrics",
        "simsp.batch_work"]) == []
    assert arrows_against_layers("simsp.commands.sweep", ["simsp.explore.configs.grid"]) == []


def test_every_module_has_a_layer():
    for path in package_files():
        layer_of(module_name(path))  # raises KeyError for a module in no layer


def test_the_architecture_doc_states_the_layers_in_the_tests_order():
    """docs/ARCHITECTURE.md's layer table, top to bottom, is tests/layering.py LAYERS."""
    doc = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    table = doc.split("## The package map, lowest layer first", 1)[1].split("\n\n")[2]
    names = [line.split("|")[1].strip() for line in table.splitlines()[2:]]
    first_prefix = {"base": "simsp", "drivers": "simsp.explore", "commands": "simsp.commands"}
    assert [first_prefix.get(name, f"simsp.{name}") for name in names] == \
        [layer[0] for layer in LAYERS]
