"""Settings: defaults, one YAML file, flags on top; bad input names the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from webhook.balancer.settings import BalancerSettings, SettingsError
from webhook.cli import main
from webhook.commands.balance import settings_from


def test_yaml_file_sets_sections_and_flags_win(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("POD_NAMESPACE", "from-env")
    monkeypatch.setenv("POD_NAME", "pod-7")
    config = tmp_path / "balancer.yaml"
    config.write_text(
        "tiers: {busy_utilization: 0.5, congested_utilization: 0.8, hysteresis: 0.05}\n"
        "taint_congested: true\n"
        "prometheus: {url: http://prom:9090, window: 10m, interval: 15}\n"
        "lease: {name: from-file, duration: 20}\n"
        "resync_interval: 120\n")
    settings = settings_from(config, prometheus="http://flag:9090", lease_name=None, dry_run=None)
    assert settings.tiers.busy_utilization == 0.5 and settings.tiers.hysteresis == 0.05
    assert settings.taint_congested is True
    assert settings.prometheus.url == "http://flag:9090" and settings.prometheus.window == "10m"
    assert settings.prometheus.interval == 15.0
    assert settings.lease.name == "from-file" and settings.lease.duration == 20.0
    assert settings.lease.namespace == "from-env" and settings.lease.identity == "pod-7"
    assert settings.resync_interval == 120.0 and settings.dry_run is False


def test_defaults_without_a_file(monkeypatch) -> None:
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    monkeypatch.setenv("POD_NAME", "me")
    settings = settings_from(None, lease_namespace=None, identity=None)
    assert settings.lease.name == "gpugate-balancer" and settings.lease.namespace == "gpugate-system"
    assert settings.health_bind == "0.0.0.0:8080" and settings.prometheus.url is None
    assert settings_from(None, identity="x", lease_namespace="ns").lease.identity == "x"


@pytest.mark.parametrize(("text", "message"), [
    ("tiers: {busy_utilisation: 0.5}\n", "unknown key 'tiers.busy_utilisation'"),
    ("resync_interval: soon\n", "resync_interval must be a float"),
    ("taint_congested: 1\n", "taint_congested must be a bool"),
    ("page_size: true\n", "page_size must be a int, got a boolean"),
    ("tiers: {busy_utilization: 0.95}\n", "busy_utilization must not exceed"),
    ("lease: {duration: 5, renew_deadline: 10}\n", "retry_period < renew_deadline < duration"),
    ("prometheus: {window: five}\n", "prometheus.window"),
    ("- a list\n", "must be a mapping"),
    ("health_bind: nope\n", "HOST:PORT"),
    ("write_qps: 0\n", "write_qps must be > 0"),
    ("write_burst: 0\n", "write_burst"),
    ("write_interval: -1\n", "write_interval >= 0"),
    ("stream_lists: maybe\n", "stream_lists must be a bool"),
])
def test_bad_files_are_refused_with_the_key_named(tmp_path: Path, text: str, message: str) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    with pytest.raises(SettingsError) as err:
        BalancerSettings.from_file(config)
    assert message in str(err.value) and str(config) in str(err.value)


def test_unreadable_yaml_is_a_clear_error(tmp_path: Path) -> None:
    config = tmp_path / "broken.yaml"
    config.write_text("tiers: [unclosed\n")
    with pytest.raises(SettingsError, match="line 2, column 1: invalid YAML") as caught:
        BalancerSettings.from_file(config)
    assert "<unicode string>" not in str(caught.value) and "\n" not in str(caught.value)  # PyYAML's own text


def test_cli_help_and_bad_config_exit_codes(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["balance", "--help"])
    assert result.exit_code == 0 and "--prometheus URL" in result.output and "--lease-namespace" in result.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("nope: 1\n")
    result = runner.invoke(main, ["balance", "--config", str(bad)])
    assert result.exit_code == 1 and "unknown key 'nope'" in result.output
    assert runner.invoke(main, ["balance", "--config", str(tmp_path / "missing.yaml")]).exit_code == 2


def test_write_pacing_comes_from_the_file_and_flags_win(tmp_path: Path) -> None:
    config = tmp_path / "balancer.yaml"
    config.write_text("write_qps: 50\nwrite_burst: 100\nwrite_interval: 30\nstream_lists: false\n")
    settings = settings_from(config, write_qps=20.0, write_burst=None, write_interval=None)
    assert (settings.write_qps, settings.write_burst, settings.write_interval) == (20.0, 100, 30.0)
    assert settings.stream_lists is False
    defaults = settings_from(None)
    assert (defaults.write_qps, defaults.write_burst, defaults.write_interval) == (200.0, 400, 10.0)


def test_credentials_flags_need_a_server(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("abc")
    result = CliRunner().invoke(main, ["balance", "--token-file", str(token)])
    assert result.exit_code == 2 and "--server" in result.output


def test_the_extender_device_policy_comes_from_the_flag_else_the_file_else_distributed(tmp_path: Path) -> None:
    assert settings_from(None).extender.device_policy == "distributed"
    config = tmp_path / "balancer.yaml"
    config.write_text("extender:\n  device_policy: packed\n")
    assert settings_from(config).extender.device_policy == "packed"
    assert settings_from(config, extender_device_policy="distributed").extender.device_policy == "distributed"
    result = CliRunner().invoke(main, ["balance", "--extender-device-policy", "spread"])
    assert result.exit_code == 2 and "'spread' is not one of 'distributed', 'packed'" in result.output


MIX = "- {cpu: 8000, gpus: 1, weight: 3}\n- {cpu: 4000, gpus: 1, gpuMilli: 500, weight: 1}\n"


def test_the_extender_pod_mix_file_comes_from_the_flag_and_needs_the_extender(tmp_path: Path) -> None:
    mix = tmp_path / "pod-mix.yaml"
    mix.write_text(MIX)
    config = tmp_path / "balancer.yaml"
    config.write_text(f"extender: {{bind: '127.0.0.1:0', cert_file: c, key_file: k, mix_file: {mix}}}\n")
    assert settings_from(config).extender.mix_file == str(mix)
    assert settings_from(None).extender.mix_file == ""
    with pytest.raises(SettingsError, match="extender.mix_file is for the extender's measure: set extender.bind"):
        settings_from(None, extender_mix=str(mix))


@pytest.mark.parametrize(("text", "message"), [
    ("", "a mix is a non-empty list of pod shapes"),
    ("[unclosed\n", "invalid YAML"),
    ("- {cpu: 1000, weight: 0}\n", "[0]: weight must be a number above 0, got 0"),
    ("- {cpu: 1000, gpus: 1, weight: 1}\n- {cpu: -5, weight: 1}\n", "[1]: cpu must be a whole number of at least 0"),
    ("- {cpu: 1000, gpus: 2, gpuMilli: 500, weight: 1}\n", "a share (gpuMilli 500) is one GPU's; got gpus: 2"),
    ("- {cpu: 1000, gpuMilli: 500, weight: 1}\n", "gpuMilli needs gpus"),
    ("- {cpu: 1000, gpus: 1, memory: 5, weight: 1}\n", "unknown key 'memory'"),
])
def test_a_bad_pod_mix_file_is_refused_by_the_command_with_the_entry_named(tmp_path: Path, text: str,
                                                                           message: str) -> None:
    mix = tmp_path / "pod-mix.yaml"
    mix.write_text(text)
    args = ["balance", "--extender-bind", "127.0.0.1:0", "--extender-cert", "c", "--extender-key", "k",
            "--extender-mix", str(mix)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1 and message in result.output and str(mix) in result.output
    result = CliRunner().invoke(main, args[:-1] + [str(tmp_path / "missing.yaml")])
    assert result.exit_code == 1 and "cannot read it" in result.output
