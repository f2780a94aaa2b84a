"""A stand-in for the Hugging Face hub on 127.0.0.1: the endpoints huggingface_hub's
snapshot_download calls (repo info at a revision, the file tree, HEAD and ranged GET of each file),
answered from repositories held in memory. Tests point HF_ENDPOINT at it. It can refuse a gated
repository without a token (401, as the hub does), cut a file's download off after some bytes, or
serve other bytes than the hashes it states, to test what a user sees then. Bounded: it answers at
most MAX_REQUESTS requests and stops itself after LIFETIME_S seconds, whatever the test does.
"""
from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

MAX_REQUESTS = 2000
LIFETIME_S = 300


@dataclass
class Repo:
    """One repository: its files at one commit, reachable by the branch names in `refs` and the
    commit itself."""

    files: dict[str, bytes]
    commit: str = "0123456789abcdef0123456789abcdef01234567"
    refs: tuple[str, ...] = ("main",)
    gated: bool = False  # 401 unless a token is sent
    # path -> bytes sent before a GET of it is cut off
    cut: dict[str, int] = field(default_factory=dict)
    # path -> bytes a GET sends instead of the file's own
    served: dict[str, bytes] = field(default_factory=dict)

    def tree(self) -> list[dict]:
        """The hub's tree entries: a file's git blob id, and an LFS file's sha256 (which its ETag
        is)."""
        return [{"type": "file", "path": p, "size": len(b),
                 "oid": hashlib.sha1(b"blob %d\0" % len(b) + b).hexdigest(),
                 **({"lfs": {"oid": hashlib.sha256(b).hexdigest(), "size": len(b),
                             "pointerSize": 134}}
                    if p.endswith((".safetensors", ".parquet", ".bin")) else {})}
                for p, b in sorted(self.files.items())]


class HubServer:
    """`with HubServer({("model", "org/name"): Repo(...)}) as hub:` then HF_ENDPOINT=hub.url;
    `hub.requests` lists (method, path, Range header) of every request answered."""

    def __init__(self, repos: dict[tuple[str, str], Repo]):
        self.repos = repos
        self.requests: list[tuple[str, str, str | None]] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        # stop() waits for the loop's next look at its shutdown flag: every 0.5 s by default, most
        # of a test's time
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.02}, daemon=True)
        self._timer = threading.Timer(LIFETIME_S, self.stop)
        self._timer.daemon = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> "HubServer":
        self._thread.start()
        self._timer.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self._timer.cancel()
        self._server.shutdown()
        self._server.server_close()

    def find(self, path: str) -> tuple[Repo | None, str, str, str]:
        """(repo, kind, revision, rest) for a request path of the API or of a file."""
        parts = [unquote(p) for p in urlsplit(path).path.strip("/").split("/")]
        if parts[:1] == ["api"]:  # api/{models,datasets}/org/name/{revision,tree}/rev[/path]
            # any other API call: unknown here
            if len(parts) < 6 or parts[1] not in ("models", "datasets"):
                return None, "", "", ""
            kind = parts[1][:-1]
            repo = self.repos.get((kind, "/".join(parts[2:4])))
            return repo, parts[4], parts[5] if len(parts) > 5 else "", "/".join(parts[6:])
        kind = "dataset" if parts[0] == "datasets" else "model"
        parts = parts[1:] if kind == "dataset" else parts
        return self.repos.get((kind, "/".join(parts[:2]))), "resolve", parts[3], "/".join(parts[4:])


def _handler(hub: HubServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet: the test reads hub.requests
            pass

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def do_GET(self) -> None:
            self._answer(body=True)

        def _send(self, status: int, data: bytes = b"", headers: dict | None = None,
                  body: bool = True) -> None:
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if body:
                self.wfile.write(data)

        def _refuse(self, status: int, code: str | None, message: str, body: bool) -> None:
            headers = {"X-Error-Message": message, **({"X-Error-Code": code} if code else {})}
            self._send(status, json.dumps({"error": message}).encode(), headers, body)

        def _answer(self, body: bool) -> None:
            hub.requests.append((self.command, self.path, self.headers.get("Range")))
            if len(hub.requests) > MAX_REQUESTS:
                return self._refuse(503, None, "stand-in hub: request cap reached", body)
            repo, what, revision, rest = hub.find(self.path)
            if repo is None:
                return self._refuse(404, "RepoNotFound", "Repository not found", body)
            if repo.gated and not self.headers.get("Authorization"):
                return self._refuse(401, "GatedRepo",
                                    "Access to this model is restricted; log in", body)

            if revision not in (*repo.refs, repo.commit):
                return self._refuse(404, "RevisionNotFound", f"Invalid rev id: {revision}", body)
            if what == "revision":
                info = {"id": "", "sha": repo.commit,
                        "siblings": [{"rfilename": p} for p in sorted(repo.files)]}
                return self._send(200, json.dumps(info).encode(),
                                  {"Content-Type": "application/json"}, body)
            if what == "tree":
                entries = [e for e in repo.tree() if e["path"].startswith(rest)]
                return self._send(200, json.dumps(entries).encode(),
                                  {"Content-Type": "application/json"}, body)
            if rest not in repo.files:
                return self._refuse(404, "EntryNotFound", f"{rest} not found", body)
            self._file(repo, rest, body)

        def _file(self, repo: Repo, path: str, body: bool) -> None:
            data = repo.served.get(path, repo.files[path])
            start = 0
            if self.headers.get("Range", "").startswith("bytes="):
                start = int(self.headers["Range"][6:].split("-")[0])
            entry = next(e for e in repo.tree() if e["path"] == path)
            etag = entry["lfs"]["oid"] if "lfs" in entry else entry["oid"]
            headers = {"X-Repo-Commit": repo.commit, "ETag": f'"{etag}"', "Accept-Ranges": "bytes"}
            if start:
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            part = data[start:]
            if not body or path not in repo.cut:
                return self._send(206 if start else 200, part, headers, body)
            # cut off: announce the whole length, send the first bytes, close the connection
            self.send_response(206 if start else 200)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(part)))
            self.end_headers()
            self.wfile.write(part[:max(0, repo.cut[path] - start)])
            self.wfile.flush()
            self.close_connection = True

    return Handler
