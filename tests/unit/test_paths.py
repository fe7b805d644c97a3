"""One path, however it is written: ``~``, trailing slashes, ``./`` and symlinks, in load_adapter and _paths."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from inference._core.paths import directory_problem, normalise_path, path_identity, path_text_problem
from inference.exceptions import AdapterAlreadyLoadedError, InvalidRequestError
from inference.fake_provider import FakeProvider


def test_normalise_path_is_lexical(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert normalise_path("adapters/a/") == normalise_path("./adapters//a") == "adapters/a"
    assert normalise_path("~/adapters/a/") == str(tmp_path / "adapters" / "a")
    assert normalise_path("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"  # a Hub repo id keeps its meaning
    assert normalise_path("hf://org/repo") == "hf://org/repo"  # a URL a server reads is sent as written
    assert normalise_path("s3://bucket//adapters/a/") == "s3://bucket//adapters/a/"


def test_path_identity_follows_symlinks_only_for_paths_that_exist(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    assert path_identity(tmp_path / "link") == path_identity(f"{real}/") == os.path.realpath(real)
    assert path_identity("/srv/adapters/a/") == "/srv/adapters/a"  # a server-side path


def test_directory_problem_says_why_without_creating_anything(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert directory_problem(tmp_path) is None
    assert directory_problem(tmp_path / "new" / "deeper") is None
    assert not (tmp_path / "new").exists()
    assert directory_problem(a_file) == "exists but is not a directory"
    assert directory_problem(a_file / "below") == f"cannot be created: {a_file} is not a directory"


def test_path_text_problem_names_the_position() -> None:
    assert path_text_problem("ok/path") is None
    assert path_text_problem("a\0b") == "holds a NUL character at position 1"
    assert "position 2" in (path_text_problem("ab\ud800") or "")
    assert path_text_problem(os.fsdecode(b"caf\xe9")) is None  # an undecodable byte kept by surrogateescape


async def test_the_same_adapter_path_with_a_trailing_slash_is_a_no_op(tmp_path: Path) -> None:
    directory = tmp_path / "adapters" / "a0"
    directory.mkdir(parents=True)
    async with FakeProvider() as fake:
        await fake.load_adapter("a0", directory)
        await fake.load_adapter("a0", f"{directory}/")
        await fake.load_adapter("a0", f"{tmp_path}/adapters/./a0")
        assert fake.backend_loads == 1
        assert fake._adapter_path("a0") == str(directory)


async def test_a_symlink_to_the_loaded_directory_is_the_same_adapter(tmp_path: Path) -> None:
    directory = tmp_path / "a0"
    directory.mkdir()
    (tmp_path / "current").symlink_to(directory)
    async with FakeProvider() as fake:
        await fake.load_adapter("a0", directory)
        await fake.load_adapter("a0", tmp_path / "current")
        assert fake.backend_loads == 1
        other = tmp_path / "a1"
        other.mkdir()
        with pytest.raises(AdapterAlreadyLoadedError):
            await fake.load_adapter("a0", other)


async def test_server_side_paths_that_do_not_exist_here_compare_lexically() -> None:
    async with FakeProvider() as fake:
        await fake.load_adapter("a0", "/srv/adapters/a0/")
        await fake.load_adapter("a0", "/srv/adapters//a0")
        assert fake.backend_loads == 1
        with pytest.raises(AdapterAlreadyLoadedError):
            await fake.load_adapter("a0", "/srv/adapters/a1")


async def test_a_tilde_in_an_adapter_path_is_expanded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    async with FakeProvider() as fake:
        await fake.load_adapter("a0", "~/adapters/a0")
        assert fake._adapter_path("a0") == str(tmp_path / "adapters" / "a0")
        await fake.load_adapter("a0", tmp_path / "adapters" / "a0")
        assert fake.backend_loads == 1


@pytest.mark.parametrize(("path", "reason"), [("a\0b", "NUL character at position 1"), ("a\ud800", "position 1")])
async def test_an_adapter_path_the_os_cannot_take_is_an_invalid_request(path: str, reason: str) -> None:
    async with FakeProvider() as fake:
        with pytest.raises(InvalidRequestError, match=reason):
            await fake.load_adapter("a0", path)
        assert await fake.list_adapters() == []
