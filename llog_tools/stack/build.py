"""Building the stack's two Go servers, Oxia and the S3 server (versitygw): each module downloaded
from the Go module proxy at a pinned version, patched (:data:`OXIA_PATCH`, :data:`S3_SERVER_PATCH`)
and built into ``<llog_home>/bin``, with a stamp file beside the binary naming the build; a binary
whose stamp names this build is not built again."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from llog import config
from llog.errors import ConfigError, LlogError
from llog_tools.stack.processes import locked


#: Oxia server version built by :func:`install`. The project pins v0.14.4, but the Go module
#: proxy reachable here answers 403 for the zips of v0.14.1..v0.14.5, and ``go install ...@v0.14.0``
#: fails too because the proxy refuses the ``@v/list`` lookup it makes. ``go mod download`` of an
#: exact version followed by ``go build ./cmd`` in a copy of the downloaded module works, so that is
#: how v0.14.0 is built.
OXIA_VERSION = "v0.14.0"

OXIA_MODULE = "github.com/oxia-db/oxia"

#: v0.14.0 takes a write's WAL offset under one lock and appends the entry under another, so two
#: concurrent writes can reach the WAL out of order; the WAL then rejects every later write of the
#: shard ("N can not immediately follow M") until a restart. :func:`install` builds it with this
#: patch, which makes taking the offset and appending one step.
OXIA_PATCH = {
    "file": "server/leader_controller.go",
    "find": "\ttimer := lc.writeLatencyHisto.Timer()\n",
    "insert_before": "\twalAppendOrder.Lock() // llog: offsets reach the WAL in the order they are taken\n"
                     "\tdefer walAppendOrder.Unlock()\n",
    "append": "\n// llog: see walAppendOrder.Lock() in write.\nvar walAppendOrder sync.Mutex\n",
}

#: What :func:`install` writes next to the binary; another value there means rebuild.
OXIA_BUILD = f"{OXIA_VERSION}+llog-wal-order"

#: The S3 server built by :func:`install`, from the Go module proxy, with :data:`S3_SERVER_PATCH`.
S3_SERVER_MODULE = "github.com/versity/versitygw"

S3_SERVER_VERSION = "v1.8.0"

#: versitygw sends a whole object with sendfile but copies a range through a buffer in user
#: space: 3 times the CPU per byte (0.7-0.8 CPU-s per GB against 0.22-0.31 here), and nearly
#: every read of llog's is a range (a body inside a shared WAL blob, after its header). On the
#: same cores as Spark that is CPU taken from the read. The patch sends a range the way a whole
#: object is sent: the file, at the range's start, limited to its length; fasthttp copies an
#: ``io.WriterTo`` body with ``WriteTo``, which flushes the response's headers and hands the
#: limited file to the connection's ``ReadFrom`` (sendfile).
S3_SERVER_PATCH = {
    "file": "backend/posix/data_io_linux.go",
    "replace": {
        "\t\"syscall\"\n\n\t\"github.com/versity/versitygw/backend\"\n": "\t\"syscall\"\n",
        "\t\trdr := io.NewSectionReader(f, startOffset, length)\n"
        "\t\treturn withReadBufferSize(&backend.FileSectionReadCloser{R: rdr, F: f}, readBufferSize), nil\n":
            "\t\tif _, err := f.Seek(startOffset, io.SeekStart); err != nil { // llog: see llogFileRange\n"
            "\t\t\treturn nil, fmt.Errorf(\"seek range start: %w\", err)\n"
            "\t\t}\n"
            "\t\treturn &llogFileRange{f: f, r: &io.LimitedReader{R: f, N: length}}, nil\n",
    },
    "append": """
// llogFileRange is a range of a file sent with sendfile, as a whole file is (llog's patch).
type llogFileRange struct {
	f *os.File
	r *io.LimitedReader
}

func (b *llogFileRange) Read(p []byte) (int, error) { return b.r.Read(p) }

func (b *llogFileRange) WriteTo(w io.Writer) (int64, error) {
	if f, ok := w.(interface{ Flush() error }); ok { // with nothing buffered, bufio passes ReadFrom on
		if err := f.Flush(); err != nil {
			return 0, err
		}
	}
	return io.Copy(w, b.r)
}

func (b *llogFileRange) Close() error { return b.f.Close() }
""",
}

#: What :func:`install` writes next to the S3 server's binary; another value there means rebuild.
S3_SERVER_BUILD = f"{S3_SERVER_VERSION}+llog-range-sendfile"

_INSTALL_TIMEOUT_S = 30 * 60


def install(home: Path | None = None) -> dict[str, Path]:
    """Install the Oxia and S3 server binaries unless present; return their paths."""
    home = Path(home) if home else config.llog_home()
    bin_dir = home / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    with locked(bin_dir / ".install.lock", _INSTALL_TIMEOUT_S, "an install"):
        oxia, stamp = bin_dir / "oxia", bin_dir / "oxia.build"
        if not (stamp.is_file() and stamp.read_text().strip() == OXIA_BUILD and _runs([str(oxia), "--help"])):
            _build_oxia(oxia)
            stamp.write_text(OXIA_BUILD + "\n")
        s3, stamp = bin_dir / "versitygw", bin_dir / "versitygw.build"
        if not (stamp.is_file() and stamp.read_text().strip() == S3_SERVER_BUILD and _runs([str(s3), "--version"])):
            _build_s3_server(s3)
            stamp.write_text(S3_SERVER_BUILD + "\n")
    return {"oxia": oxia, "s3": s3}


def _go_env(target: Path, what: str) -> dict[str, str]:
    """The environment for ``go`` builds: the user's, with the module cache left writable."""
    if not shutil.which("go"):
        raise ConfigError(
            f"{what} is built from source into {target} and needs Go: install Go "
            "(https://go.dev/dl/) and put `go` on PATH"
        )
    goflags = _run(["go", "env", "GOFLAGS"], timeout=60).strip()  # keep the user's, add ours
    return {**os.environ, "GOFLAGS": f"{goflags} -modcacherw".strip()}


def _build_s3_server(target: Path) -> None:
    _build_patched("versitygw", S3_SERVER_MODULE, S3_SERVER_VERSION, "./cmd/versitygw", _patch_s3_server, target,
                   "about 3 minutes")


def _build_oxia(target: Path) -> None:
    _build_patched("oxia", OXIA_MODULE, OXIA_VERSION, "./cmd", _patch_oxia, target, "about 2 minutes")


def _build_patched(name: str, module: str, version: str, package: str, patch: Callable[[Path], None],
                   target: Path, takes: str) -> None:
    """``go mod download`` of ``module@version``, ``patch`` on a copy of its source, and ``go
    build`` of ``package`` there into ``target`` (replaced only by a finished build)."""
    env = _go_env(target, f"the {name} server")
    started = time.monotonic()
    _progress(f"building {name} {version} into {target} (the first build takes {takes})")
    with tempfile.TemporaryDirectory(prefix=f"llog-{name}-") as tmp:
        out = _run(["go", "mod", "download", "-json", f"{module}@{version}"], cwd=tmp, env=env, timeout=600)
        info = json.loads(out)
        if info.get("Error") or not info.get("Dir"):
            raise LlogError(f"go mod download {module}@{version} failed: {info.get('Error', out)}")
        source = Path(tmp) / name
        shutil.copytree(info["Dir"], source, copy_function=shutil.copyfile)  # the cache is read-only
        patch(source)
        _progress(f"downloaded and patched {module}@{version}; compiling")
        partial = target.with_name(f".{name}.{os.getpid()}.tmp")
        try:
            _run(["go", "build", "-o", str(partial), package], cwd=source, env=env, timeout=1800)
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
    _progress(f"built {target} in {time.monotonic() - started:.0f} s")


def _patch_oxia(source: Path) -> None:
    path = source / OXIA_PATCH["file"]
    text = path.read_text()
    if text.count(OXIA_PATCH["find"]) != 1:
        raise LlogError(f"cannot patch {path}: it does not look like oxia {OXIA_VERSION}")
    text = text.replace(OXIA_PATCH["find"], OXIA_PATCH["insert_before"] + OXIA_PATCH["find"])
    path.write_text(text + OXIA_PATCH["append"])


def _patch_s3_server(source: Path) -> None:
    path = source / S3_SERVER_PATCH["file"]
    text = path.read_text()
    for find, replace in S3_SERVER_PATCH["replace"].items():
        if text.count(find) != 1:
            raise LlogError(f"cannot patch {path}: it does not look like versitygw {S3_SERVER_VERSION}")
        text = text.replace(find, replace)
    path.write_text(text + S3_SERVER_PATCH["append"])


def _run(cmd: list[str], timeout: float, **kwargs) -> str:
    """Run ``cmd``; return its stdout, or raise LlogError with the tail of its output."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired:
        raise LlogError(f"`{' '.join(cmd)}` did not finish within {timeout:.0f} s") from None
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-20:])
        raise LlogError(f"`{' '.join(cmd)}` failed with exit code {done.returncode}:\n{tail}")
    return done.stdout


def _runs(cmd: list[str]) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _progress(message: str) -> None:
    print(f"llog: {message}", file=sys.stderr, flush=True)
