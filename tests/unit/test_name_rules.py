"""Names that become file names (core/names.py): one rule, checked before anything is opened."""

from __future__ import annotations

from pathlib import Path

import pytest

from zfab import BadNameError, Settings, Worker, task
from zfab.core.names import MAX_PATH_NAME_BYTES, check_path_name
from zfab.transport.security import create_keys
from zfab.worker.naming import claim_name


class Echo(Worker):
    service = "echo"

    @task
    def echo(self, data: str) -> str:
        return data


GOOD = ["demo-1", "w1", "zfab-worker-7f9c", "host.example.com", "a_b", "user@host", "v1+build", "café-1", "a..b"]
BAD = ["a/b", "../x", "..", ".", ".hidden", "", "-flag", "a b", "a\nb", "a\x00b", "/abs", "a\\b", "x~1", "é/../.."]


@pytest.mark.parametrize("name", GOOD)
def test_a_plain_name_passes_as_it_is(name: str) -> None:
    assert check_path_name(name) == name


@pytest.mark.parametrize("name", BAD)
def test_a_name_that_is_a_path_or_no_file_name_is_refused_with_the_rule(name: str) -> None:
    with pytest.raises(BadNameError, match="not allowed") as exc:
        check_path_name(name, "worker name")
    assert isinstance(exc.value, ValueError)  # a ValueError to Python callers, one line to the CLI
    assert "\n" not in str(exc.value)


def test_a_name_is_bounded_in_bytes_not_characters() -> None:
    check_path_name("x" * MAX_PATH_NAME_BYTES)
    with pytest.raises(BadNameError, match=f"at most {MAX_PATH_NAME_BYTES}"):
        check_path_name("é" * (MAX_PATH_NAME_BYTES // 2 + 1))


@pytest.mark.parametrize("name", ["a/b", "../x", "../../etc/x"])
def test_claiming_a_path_as_a_worker_name_writes_nothing_anywhere(tmp_path: Path, name: str) -> None:
    data = tmp_path / "data"
    with pytest.raises(BadNameError):
        claim_name(data, "demo", name)
    assert not any(tmp_path.rglob("*"))  # not even the data directory was made


def test_a_service_name_that_is_a_path_is_refused_when_it_makes_the_default_name(tmp_path: Path) -> None:
    with pytest.raises(BadNameError, match="service name 'a/b'"):
        claim_name(tmp_path, "a/b", None)
    assert not any(tmp_path.rglob("*"))


def test_a_worker_refuses_a_path_as_its_name_before_it_opens_its_store(tmp_path: Path) -> None:
    s = Settings(data_dir=str(tmp_path / "data"))
    with pytest.raises(BadNameError, match=r"worker name '\.\./x'"):
        Echo(name="../x", settings=s)
    with pytest.raises(BadNameError, match="service name"):
        Echo(name=None, service="x/../../y", settings=s)
    assert not (tmp_path / "x").exists() and not (tmp_path / "data" / "workers").exists()


def test_a_key_pair_name_and_its_worker_binding_follow_the_same_rule(tmp_path: Path) -> None:
    with pytest.raises(BadNameError, match="key name"):
        create_keys(tmp_path / "keys", "../broker")
    with pytest.raises(BadNameError, match="worker name"):
        create_keys(tmp_path / "keys", "w1", worker='w1"\n    admin = "yes')
    assert not (tmp_path / "keys").exists() and not (tmp_path / "broker.key").exists()
    public, _ = create_keys(tmp_path / "keys", "w1", worker="zfab-worker-*")  # a prefix binding
    assert 'worker = "zfab-worker-*"' in public.read_text()


def test_a_name_held_by_a_live_worker_of_the_same_data_directory_is_refused_like_a_bad_name(tmp_path: Path) -> None:
    _, lock = claim_name(tmp_path, "demo", "w1")
    try:
        with pytest.raises(BadNameError, match="another worker named 'w1' is running"):
            claim_name(tmp_path, "demo", "w1")
    finally:
        lock.close()
    _, again = claim_name(tmp_path, "demo", "w1")  # free once its holder let go
    again.close()
