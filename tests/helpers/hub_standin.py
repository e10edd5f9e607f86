"""A local stand-in for the Hugging Face Hub (no network here): an HTTP server on 127.0.0.1 that serves small
repos in the Hub's file API layout, for ``HF_ENDPOINT`` to point ``huggingface_hub`` at.

Routes, as huggingface_hub 2.x calls them: ``GET /api/models/ORG/NAME[/revision/REV]?blobs=true`` (the repo's
commit and files with ``size``, ``blobId`` and, for LFS files, ``lfs.sha256``) and ``HEAD``/``GET
/ORG/NAME/resolve/REV/PATH`` (``X-Repo-Commit``, ``ETag``/``X-Linked-Etag``, ``Content-Length``, ``Range``).
Errors carry the Hub's ``X-Error-Code`` (RepoNotFound, RevisionNotFound, EntryNotFound). A file can be served
corrupted (same size, one byte flipped, the genuine hashes listed: a bad mirror) or cut short once (the
connection closed mid-body: an interrupted download to resume). Every request is recorded. No tests here.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".gguf", ".bin", ".onnx")


@dataclass
class Repo:
    files: dict[str, bytes]
    commit: str = ""

    def __post_init__(self) -> None:
        if not self.commit:
            digest = hashlib.sha1(json.dumps(sorted(self.files)).encode())
            for data in self.files.values():
                digest.update(hashlib.sha1(data).digest())
            self.commit = digest.hexdigest()


def _is_lfs(path: str) -> bool:
    return path.endswith(LFS_SUFFIXES)


def _blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class HubStandIn:
    repos: dict[str, Repo]
    corrupt: set[tuple[str, str]] = field(default_factory=set)  # (repo, path) served with a byte flipped
    cut_once: dict[tuple[str, str], int] = field(default_factory=dict)  # first GET stops after N bytes
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)  # method, path, Range
    url: str = ""
    _server: ThreadingHTTPServer | None = None

    def start(self) -> HubStandIn:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_HEAD(self) -> None:
                hub._answer(self, body=False)

            def do_GET(self) -> None:
                hub._answer(self, body=True)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def gets(self, path_part: str) -> list[str | None]:
        """The Range headers of the GETs whose path holds ``path_part``."""
        return [r for m, p, r in self.requests if m == "GET" and path_part in p]

    # -- routes ----------------------------------------------------------------------------------------
    def _answer(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(urlsplit(h.path).path)
        self.requests.append((h.command, path, h.headers.get("Range")))
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            self._info(
                h, "/".join(parts[2:4]), parts[5] if len(parts) >= 6 and parts[4] == "revision" else None
            )
        elif len(parts) >= 5 and parts[2] == "resolve":
            self._file(h, "/".join(parts[:2]), parts[3], "/".join(parts[4:]), body)
        else:
            self._error(h, 404, "RepoNotFound", "not found", body)

    def _repo(self, h: BaseHTTPRequestHandler, repo_id: str, rev: str | None, body: bool) -> Repo | None:
        repo = self.repos.get(repo_id)
        if repo is None:
            self._error(h, 404, "RepoNotFound", "Repository not found", body)
            return None
        if rev not in (None, "main", repo.commit):
            self._error(h, 404, "RevisionNotFound", "Invalid rev id", body)
            return None
        return repo

    def _info(self, h: BaseHTTPRequestHandler, repo_id: str, rev: str | None) -> None:
        repo = self._repo(h, repo_id, rev, True)
        if repo is None:
            return
        siblings = []
        for name, data in sorted(repo.files.items()):
            entry: dict[str, Any] = {"rfilename": name, "size": len(data), "blobId": _blob_id(data)}
            if _is_lfs(name):
                sha = hashlib.sha256(data).hexdigest()
                entry["lfs"] = {"sha256": sha, "size": len(data), "pointerSize": 134}
            siblings.append(entry)
        payload = json.dumps({"id": repo_id, "modelId": repo_id, "sha": repo.commit, "private": False,
                              "siblings": siblings}).encode()  # fmt: skip
        self._send(h, 200, {"Content-Type": "application/json"}, payload, True)

    def _file(self, h: BaseHTTPRequestHandler, repo_id: str, rev: str, path: str, body: bool) -> None:
        repo = self._repo(h, repo_id, rev, body)
        if repo is None:
            return
        data = repo.files.get(path)
        if data is None:
            self._error(h, 404, "EntryNotFound", "Entry not found", body, {"X-Repo-Commit": repo.commit})
            return
        etag = hashlib.sha256(data).hexdigest() if _is_lfs(path) else _blob_id(data)
        if (repo_id, path) in self.corrupt:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        headers = {"X-Repo-Commit": repo.commit, "ETag": f'"{etag}"', "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream"}  # fmt: skip
        if _is_lfs(path):
            headers |= {"X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(len(data))}
        start = 0
        wanted = h.headers.get("Range")
        if wanted and wanted.startswith("bytes=") and body:
            start = int(wanted[len("bytes=") :].split("-")[0])
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        cut = self.cut_once.pop((repo_id, path), None) if body else None
        h.send_response(206 if start else 200)
        for k, v in headers.items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(data) - start))
        h.end_headers()
        if body:
            h.wfile.write(data[start : cut if cut is not None else len(data)])
            if cut is not None:
                h.wfile.flush()
                h.close_connection = True

    def _error(self, h: BaseHTTPRequestHandler, status: int, code: str, message: str, body: bool,
               extra: dict[str, str] | None = None) -> None:  # fmt: skip
        headers = {"X-Error-Code": code, "X-Error-Message": message, "Content-Type": "application/json"}
        self._send(h, status, headers | (extra or {}), json.dumps({"error": message}).encode(), body)

    @staticmethod
    def _send(
        h: BaseHTTPRequestHandler, status: int, headers: dict[str, str], payload: bytes, body: bool
    ) -> None:
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(payload)))
        h.end_headers()
        if body:
            h.wfile.write(payload)
