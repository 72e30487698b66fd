"""The run-api command line: flags generated from APISettings."""

from __future__ import annotations

import pytest

from atroposlib.api.settings import APISettings
from atroposlib.cli.run_api import build_parser, main
from atroposlib.utils.flags import FlagError, model_from_args


def settings_from(*argv: str) -> APISettings:
    return model_from_args(APISettings, build_parser().parse_args(list(argv)))


def test_defaults_match_atropos():
    settings = settings_from()
    assert (settings.host, settings.port, settings.reload) == ("127.0.0.1", 8000, False)
    assert settings.ephemeral is False and settings.state_dir == "./.atropos"


def test_values_and_booleans():
    settings = settings_from(
        "--port", "9001", "--ephemeral", "--reload", "false", "--max-body-mb", "2"
    )
    assert settings.port == 9001 and settings.ephemeral is True and settings.reload is False
    assert settings.max_body_bytes == 2 * 2**20
    assert settings_from("--insecure", "TRUE").insecure is True


def test_bad_values_name_the_flag(capsys):
    with pytest.raises(FlagError, match="--port 'abc'"):
        settings_from("--port", "abc")
    with pytest.raises(SystemExit) as exit_info:
        main(["--log-level", "loud"])
    assert exit_info.value.code == 2
    assert "--log-level 'loud'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--ephemeral", "maybe"])


def test_help_lists_every_setting_with_its_default():
    text = build_parser().format_help()
    for name in APISettings.model_fields:
        assert "--" + name.replace("_", "-") in text
    assert "(default: 100000)" in text
    # --allowed-hosts defaults to an empty list, made by a factory: nothing to show
    assert "PydanticUndefined" not in text
