"""`glassbox pull` (glassbox/store/pull.py) against a local stand-in for the Hugging Face Hub.

There is no network here: tests/helpers/hub_standin.py serves small repos in the Hub's file API layout on
127.0.0.1 and ``HF_ENDPOINT`` points huggingface_hub at it. What lands in the cache is read back with
huggingface_hub's own reader (``try_to_load_from_cache``, ``scan_cache_dir``); the files are a tiny real
GGUF checkpoint (tests/helpers/gguf_factory.py) and the bundled demo model's safetensors."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as Q
from gguf_factory import Spec, write_model
from hub_standin import HubStandIn, Repo
from huggingface_hub import scan_cache_dir, try_to_load_from_cache

from glassbox.models.sources import DEMO_MODEL_DIR, resolve_model
from glassbox.store.pull import pull

GGUF_REPO = "acme/tiny-GGUF"
DEMO_REPO = "acme/demo"
BAD_REPO = "acme/corrupt-GGUF"
BIG_REPO = "acme/big-GGUF"  # bigger than huggingface_hub's 10 MiB read chunk: a cut after one chunk resumes
BIG_FILE = "big-Q8_0.gguf"


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubStandIn]:
    root = tmp_path_factory.mktemp("hub-files")
    ggufs = {}
    for qtype in (Q.Q8_0, Q.Q4_1):
        path = root / f"tiny-{qtype.name}.gguf"
        write_model(path, Spec(qtype=qtype, hidden=64, ffn=96))
        ggufs[f"tiny-{qtype.name}.gguf"] = path.read_bytes()
    demo = {p.name: p.read_bytes() for p in DEMO_MODEL_DIR.iterdir() if p.is_file()}
    demo["pytorch_model.bin"] = b"\0" * 1000  # another format's copy: not needed
    demo["onnx/model.onnx"] = b"\1" * 1000
    repos = {
        GGUF_REPO: Repo({**ggufs, "README.md": b"# tiny\n", "mmproj-tiny-F16.gguf": b"GGUF" + b"\0" * 60}),
        DEMO_REPO: Repo(demo),
        BAD_REPO: Repo({"tiny-Q8_0.gguf": ggufs["tiny-Q8_0.gguf"]}),
        BIG_REPO: Repo({BIG_FILE: ggufs["tiny-Q8_0.gguf"] + os.urandom(24 << 20)}),
    }
    server = HubStandIn(repos, corrupt={(BAD_REPO, "tiny-Q8_0.gguf")}).start()
    yield server
    server.stop()


@pytest.fixture
def cache(hub: HubStandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "hub-cache"
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "no-ollama"))
    hub.requests.clear()
    return cache


def test_pull_quant_fetches_that_gguf_only(hub: HubStandIn, cache: Path) -> None:
    got = pull(f"{GGUF_REPO}:q4_1")
    assert got.name == f"{GGUF_REPO}:Q4_1"
    cached = try_to_load_from_cache(GGUF_REPO, "tiny-Q4_1.gguf", cache_dir=cache)
    assert isinstance(cached, str) and got.files == (Path(cached),)
    served = hub.repos[GGUF_REPO].files["tiny-Q4_1.gguf"]
    assert hashlib.sha256(Path(cached).read_bytes()).digest() == hashlib.sha256(served).digest()
    fetched = {p.rsplit("/", 1)[1] for m, p, _ in hub.requests if m == "GET" and "/resolve/" in p}
    assert fetched == {"tiny-Q4_1.gguf"}
    source = resolve_model(got.name)  # found by the name pull printed
    assert (source.format, source.path) == ("gguf", Path(cached))
    with pytest.raises(FileNotFoundError, match=r"several|holds 2 GGUF"):
        pull(GGUF_REPO)  # two checkpoints (the projector is not one): name the quant
    with pytest.raises(FileNotFoundError, match=r"no GGUF file for 'Q5_K_M'.*Q8_0"):
        pull(f"{GGUF_REPO}:Q5_K_M")


def test_pull_a_safetensors_repo_fetches_config_weights_and_tokenizer(hub: HubStandIn, cache: Path) -> None:
    got = pull(DEMO_REPO)
    (repo,) = scan_cache_dir(cache).repos
    (revision,) = repo.revisions
    names = {f.file_path.relative_to(revision.snapshot_path).as_posix() for f in revision.files}
    demo = {p.name for p in DEMO_MODEL_DIR.iterdir() if p.is_file() and p.name != "README.md"}
    assert names == demo  # not the .bin, the .onnx or the README
    assert resolve_model(DEMO_REPO).path == revision.snapshot_path and got.revision == revision.commit_hash


def test_a_checksum_mismatch_is_refused_and_removed(hub: HubStandIn, cache: Path) -> None:
    with pytest.raises(ValueError, match="checksum mismatch for tiny-Q8_0.gguf"):
        pull(BAD_REPO)
    assert try_to_load_from_cache(BAD_REPO, "tiny-Q8_0.gguf", cache_dir=cache) is None
    (repo,) = scan_cache_dir(cache).repos
    assert not any(repo.repo_path.glob("blobs/*"))


def test_an_interrupted_download_resumes(hub: HubStandIn, cache: Path) -> None:
    cut = 15 << 20  # the connection drops after 15 MiB of the first GET
    hub.cut_once[(BIG_REPO, BIG_FILE)] = cut
    pull(BIG_REPO)  # huggingface_hub resumes from the bytes it kept
    ranges = hub.gets(BIG_FILE)
    assert len(ranges) == 2 and ranges[0] is None, ranges
    assert ranges[1] is not None and ranges[1].endswith("-")
    start = int(ranges[1].removeprefix("bytes=").rstrip("-"))
    assert 0 < start <= cut, ranges
    cached = try_to_load_from_cache(BIG_REPO, BIG_FILE, cache_dir=cache)
    assert isinstance(cached, str) and Path(cached).read_bytes() == hub.repos[BIG_REPO].files[BIG_FILE]


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "glassbox.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=120)  # fmt: skip


def test_pull_errors_name_their_cause(hub: HubStandIn, cache: Path, tmp_path: Path) -> None:
    env = {"HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(cache)}
    missing = _cli(env, "pull", "acme/nope")
    assert missing.returncode == 2 and "acme/nope was not found on " + hub.url in missing.stderr
    with socket_closed() as port:
        offline = _cli({**env, "HF_ENDPOINT": f"http://127.0.0.1:{port}"}, "pull", GGUF_REPO + ":Q8_0")
    assert offline.returncode == 2 and "cannot reach http://127.0.0.1" in offline.stderr, offline.stderr
    flagged = _cli({**env, "HF_HUB_OFFLINE": "1"}, "pull", GGUF_REPO + ":Q8_0")
    assert flagged.returncode == 2 and "HF_HUB_OFFLINE" in flagged.stderr, flagged.stderr
    bad = _cli(env, "pull", "../etc/passwd")
    assert bad.returncode == 2 and "REPO must be a Hugging Face repo id" in bad.stderr
    ok = _cli(env, "pull", GGUF_REPO + ":Q8_0")
    assert ok.returncode == 0 and f"glassbox serve {GGUF_REPO}:Q8_0" in ok.stdout, ok.stderr
    for out in (missing, offline, flagged, bad):
        assert "Traceback" not in out.stderr


class socket_closed:
    """A local port that nothing listens on (bound, then closed)."""

    def __enter__(self) -> int:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        pass
