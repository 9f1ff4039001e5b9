"""Unit tests of Coil's typed configuration."""

from __future__ import annotations

import pytest

from coil import config
from coil.errors import ConfigError


def test_env_override(monkeypatch):
    monkeypatch.setenv("COIL_MAX_FUSION_SIZE", "7")
    config.reload_from_env()
    try:
        assert config.get().max_fusion_size == 7
    finally:
        monkeypatch.delenv("COIL_MAX_FUSION_SIZE")
        config.reload_from_env()


def test_scoped_override_restores():
    before = config.get().max_fusion_size
    with config.override(max_fusion_size=3):
        assert config.get().max_fusion_size == 3
    assert config.get().max_fusion_size == before


def test_unknown_and_badly_typed_keys():
    with pytest.raises(ConfigError, match="known options: .*cache_dir"):
        config.validated({"nope": 1})
    with pytest.raises(ConfigError, match="expected an integer"):
        config.validated({"max_fusion_size": "many"})
    assert config.validated({"max_fusion_size": "5"}) == {"max_fusion_size": 5}
