"""Registry throughput, each backend beside the raw library doing the same work.

    python bench/registry.py [--seconds 0.25] [--etcd host:port] [--only sqlite]
    python bench/registry.py --quick     # 0.05 s windows, two rounds: seconds

For SQLite the baseline is raw ``sqlite3`` statements writing the same rows (the
key, its changelog row, the revision bump) in one transaction per write, on a
file with the same journal mode and ``synchronous`` setting; a get is one raw
SELECT. For etcd the baseline is raw httpx calls to the same etcd doing the same
requests. The etcd rows need an etcd: ``--etcd``, ``CORRAL_TEST_ETCD``, or a
temporary one started here when ``etcd`` is on PATH (and stopped at the end).

Measured: sequential puts/s, gets/s, guarded txns/s (compare mod revision, then
put) and concurrent puts/s (16 tasks). Each pair is measured five times,
alternating, and the best run of each side is kept (the machine is shared). The last line
is one JSON object; its ``*_ratio`` keys are backend / baseline (target >= 0.7), and
``load_average`` is the 1-minute load when the run ended (the machine is shared: run
it a few times and compare medians). Beside them, ``*_ratio_median`` is the median
of each round's own ratio (its two sides measured back to back), and for SQLite
``*_cpu_us`` / ``*_cpu_ratio`` compare the CPU time this process spends per
operation, which waits for a disk shared with other work do not move.

Figures (the last line, one JSON object): ``memory_put_per_s``, ``memory_get_per_s``,
``memory_txn_per_s``; ``sqlite_put_per_s``, ``sqlite_raw_put_per_s``, ``sqlite_put_ratio``,
``sqlite_put_ratio_median``, ``sqlite_put_cpu_us``, ``sqlite_raw_put_cpu_us``,
``sqlite_put_cpu_ratio``, the same seven for get (``sqlite_get_per_s``,
``sqlite_raw_get_per_s``, ``sqlite_get_ratio``, ``sqlite_get_ratio_median``,
``sqlite_get_cpu_us``, ``sqlite_raw_get_cpu_us``, ``sqlite_get_cpu_ratio``) and for txn
(``sqlite_txn_per_s``, ``sqlite_raw_txn_per_s``, ``sqlite_txn_ratio``,
``sqlite_txn_ratio_median``, ``sqlite_txn_cpu_us``, ``sqlite_raw_txn_cpu_us``,
``sqlite_txn_cpu_ratio``), ``sqlite_concurrent_put_per_s``,
``sqlite_raw_concurrent_put_per_s``, ``sqlite_concurrent_put_ratio``; when an etcd was
measured ``etcd_put_per_s``, ``etcd_raw_put_per_s``, ``etcd_put_ratio``,
``etcd_put_ratio_median``, the same four for get (``etcd_get_per_s``,
``etcd_raw_get_per_s``, ``etcd_get_ratio``, ``etcd_get_ratio_median``) and txn
(``etcd_txn_per_s``, ``etcd_raw_txn_per_s``, ``etcd_txn_ratio``,
``etcd_txn_ratio_median``), ``etcd_concurrent_put_per_s``,
``etcd_raw_concurrent_put_per_s``, ``etcd_concurrent_put_ratio``; and ``load_average``.
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import os
import shutil
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

import httpx
import trio

from corral.registry import Compare, EtcdRegistry, MemoryRegistry, Put, Registry, SQLiteRegistry

KEYS = [f"apps/bench-{i}" for i in range(64)]
VALUE = b'{"v":1,"name":"bench","replicas":1}' * 4
TASKS = 16


# --------------------------------------------------------------------- timing


class Rate(NamedTuple):
    """One measurement window: operations per second of wall time, and the CPU
    time this process spent per operation (every thread of it: the SQLite
    checkpoint thread too). On a shared machine the CPU figure moves far less
    than the wall-clock one: waits for the disk and for other people's work
    are not in it."""

    per_s: float
    cpu_us: float


def rate_sync(seconds: float, op: Callable[[int], None]) -> Rate:
    done, start, cpu = 0, time.perf_counter(), time.process_time()
    while True:
        for _ in range(50):
            op(done)
            done += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return Rate(done / elapsed, (time.process_time() - cpu) / done * 1e6)


async def rate_async(seconds: float, op: Callable[[int], Awaitable[object]]) -> Rate:
    done, start, cpu = 0, time.perf_counter(), time.process_time()
    while True:
        for _ in range(20):
            await op(done)
            done += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return Rate(done / elapsed, (time.process_time() - cpu) / done * 1e6)


async def rate_concurrent(seconds: float, op: Callable[[int], Awaitable[object]]) -> float:
    counts = [0] * TASKS
    deadline = time.perf_counter() + seconds
    start = time.perf_counter()

    async def worker(t: int) -> None:
        i = t
        while time.perf_counter() < deadline:
            await op(i)
            counts[t] += 1
            i += TASKS

    async with trio.open_nursery() as nursery:
        for t in range(TASKS):
            nursery.start_soon(worker, t)
    return sum(counts) / (time.perf_counter() - start)


def rate_threads(seconds: float, make_op: Callable[[], Callable[[int], None]]) -> float:
    counts = [0] * TASKS
    deadline = time.perf_counter() + seconds
    ops = [make_op() for _ in range(TASKS)]

    def worker(t: int) -> None:
        i = t
        while time.perf_counter() < deadline:
            ops[t](i)
            counts[t] += 1
            i += TASKS

    start = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(t,)) for t in range(TASKS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(counts) / (time.perf_counter() - start)


Pair = tuple[str, Callable[[int], Awaitable[object]], Callable[[int], Any]]
ROUNDS = 5
QUICK_ROUNDS = 2
QUICK_SECONDS = 0.05


class Measured(NamedTuple):
    """Per figure: each side's best rate, the median over rounds of each round's
    own ratio (both sides of it measured back to back), and each side's least
    CPU time per operation."""

    ours: dict[str, float]
    base: dict[str, float]
    ratio_median: dict[str, float]
    ours_cpu_us: dict[str, float]
    base_cpu_us: dict[str, float]


async def measure_pairs(seconds: float, pairs: list[Pair], rounds: int) -> Measured:
    """Alternate ours and raw for each figure ``rounds`` times; keep each side's best
    (other work on a shared machine only ever slows a run down)."""
    ours = {name: 0.0 for name, _, _ in pairs}
    base = {name: 0.0 for name, _, _ in pairs}
    ours_cpu = {name: math.inf for name, _, _ in pairs}
    base_cpu = {name: math.inf for name, _, _ in pairs}
    ratios: dict[str, list[float]] = {name: [] for name, _, _ in pairs}
    for _ in range(rounds):
        for name, op, raw_op in pairs:
            mine = await rate_async(seconds, op)
            probe = raw_op(0)
            if isinstance(probe, Awaitable):
                await probe
                theirs = await rate_async(seconds, raw_op)
            else:
                theirs = rate_sync(seconds, raw_op)
            ours[name] = max(ours[name], mine.per_s)
            base[name] = max(base[name], theirs.per_s)
            ours_cpu[name] = min(ours_cpu[name], mine.cpu_us)
            base_cpu[name] = min(base_cpu[name], theirs.cpu_us)
            ratios[name].append(mine.per_s / theirs.per_s)
    medians = {name: statistics.median(values) for name, values in ratios.items()}
    return Measured(ours, base, medians, ours_cpu, base_cpu)


# --------------------------------------------------------------------- sqlite


class RawSQLite:
    """The same rows our put writes, with raw sqlite3 statements."""

    SCHEMA = """
        CREATE TABLE IF NOT EXISTS meta (id INTEGER PRIMARY KEY, revision INTEGER NOT NULL);
        INSERT OR IGNORE INTO meta VALUES (0, 1);
        CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value BLOB NOT NULL,
            create_revision INTEGER NOT NULL, mod_revision INTEGER NOT NULL,
            version INTEGER NOT NULL, lease INTEGER) WITHOUT ROWID;
        CREATE TABLE IF NOT EXISTS changes (revision INTEGER NOT NULL, seq INTEGER NOT NULL,
            deleted INTEGER NOT NULL, key TEXT NOT NULL, value BLOB NOT NULL,
            create_revision INTEGER NOT NULL, version INTEGER NOT NULL, lease INTEGER,
            PRIMARY KEY (revision, seq)) WITHOUT ROWID;
    """

    def __init__(self, path: str, synchronous: str) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute(f"PRAGMA synchronous={synchronous}")
        self.conn.executescript(self.SCHEMA)

    def put(self, key: str, *, expect_mod: int | None = None) -> int:
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        (revision,) = conn.execute("SELECT revision FROM meta").fetchone()
        row = conn.execute(
            "SELECT create_revision, version, mod_revision FROM kv WHERE key = ?", (key,)
        ).fetchone()
        if expect_mod is not None and (row[2] if row else 0) != expect_mod:
            conn.execute("COMMIT")
            return -1
        revision += 1
        create, version = (revision, 1) if row is None else (row[0], row[1] + 1)
        conn.execute(
            "INSERT OR REPLACE INTO kv VALUES (?, ?, ?, ?, ?, NULL)",
            (key, VALUE, create, revision, version),
        )
        conn.execute(
            "INSERT INTO changes VALUES (?, 0, 0, ?, ?, ?, ?, NULL)",
            (revision, key, VALUE, create, version),
        )
        conn.execute("UPDATE meta SET revision = ?", (revision,))
        conn.execute("COMMIT")
        return revision

    def get(self, key: str) -> object:
        return self.conn.execute("SELECT * FROM kv WHERE key = ?", (key,)).fetchone()


async def bench_sqlite(
    seconds: float, rounds: int, directory: str, synchronous: str
) -> dict[str, float]:
    ours_db = os.path.join(directory, f"ours-{synchronous}.db")
    raw_db = os.path.join(directory, f"raw-{synchronous}.db")
    registry = await SQLiteRegistry.open(ours_db, synchronous=synchronous)
    raw = RawSQLite(raw_db, synchronous)
    figures: dict[str, float] = {}
    try:
        for key in KEYS:
            await registry.put(key, VALUE)
            raw.put(key)
        pairs: list[Pair] = [
            ("put", lambda i: registry.put(KEYS[i % 64], VALUE), lambda i: raw.put(KEYS[i % 64])),
            ("get", lambda i: registry.get(KEYS[i % 64]), lambda i: raw.get(KEYS[i % 64])),
            ("txn", guarded_txn(registry), raw_guarded_txn(raw)),
        ]
        measured = await measure_pairs(seconds, pairs, rounds)
        ours, base = measured.ours, measured.base
        ours["concurrent_put"] = base["concurrent_put"] = 0.0
        for _ in range(rounds):
            ours["concurrent_put"] = max(
                ours["concurrent_put"],
                await rate_concurrent(seconds, lambda i: registry.put(KEYS[i % 64], VALUE)),
            )
            # Raw concurrency: one connection per thread (SQLite serializes writers
            # on its lock) or, if faster, the single-connection sequential rate.
            threaded = rate_threads(seconds, lambda: per_thread_put(raw_db, synchronous))
            base["concurrent_put"] = max(base["concurrent_put"], threaded, base["put"])
        for name in ours:
            figures[f"sqlite_{name}_per_s"] = round(ours[name])
            figures[f"sqlite_raw_{name}_per_s"] = round(base[name])
            figures[f"sqlite_{name}_ratio"] = round(ours[name] / base[name], 2)
        for name in measured.ratio_median:
            figures[f"sqlite_{name}_ratio_median"] = round(measured.ratio_median[name], 2)
            figures[f"sqlite_{name}_cpu_us"] = round(measured.ours_cpu_us[name], 2)
            figures[f"sqlite_raw_{name}_cpu_us"] = round(measured.base_cpu_us[name], 2)
            figures[f"sqlite_{name}_cpu_ratio"] = round(
                measured.base_cpu_us[name] / measured.ours_cpu_us[name], 2
            )
    finally:
        await registry.aclose()
        raw.conn.close()
    return figures


def per_thread_put(path: str, synchronous: str) -> Callable[[int], None]:
    raw = RawSQLite(path, synchronous)

    def put(i: int) -> None:
        raw.put(KEYS[i % 64])

    return put


def guarded_txn(registry: Registry) -> Callable[[int], Awaitable[object]]:
    state = {"mod": 0}

    async def op(i: int) -> None:
        key = KEYS[0]
        result = await registry.txn([Compare.mod_revision_is(key, state["mod"])], [Put(key, VALUE)])
        if result.succeeded:
            state["mod"] = result.revision
        else:  # first call: learn the key's mod revision
            kv = await registry.get(key)
            state["mod"] = kv.mod_revision if kv else 0

    return op


def raw_guarded_txn(raw: RawSQLite) -> Callable[[int], None]:
    state = {"mod": 0}

    def op(i: int) -> None:
        revision = raw.put(KEYS[0], expect_mod=state["mod"])
        if revision < 0:
            row = raw.conn.execute(
                "SELECT mod_revision FROM kv WHERE key = ?", (KEYS[0],)
            ).fetchone()
            state["mod"] = row[0]
        else:
            state["mod"] = revision

    return op


# --------------------------------------------------------------------- etcd


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def bench_etcd(seconds: float, rounds: int, endpoint: str) -> dict[str, float]:
    prefix = f"corral-bench/{os.getpid()}/"
    registry = EtcdRegistry([endpoint], prefix=prefix)
    url = f"http://{endpoint}"
    client = httpx.AsyncClient(timeout=10, headers={"Content-Type": "application/json"})
    full = [b64((prefix + k).encode()) for k in KEYS]
    value = b64(VALUE)

    async def raw_put(i: int) -> None:
        r = await client.post(
            url + "/v3/kv/put", content=json.dumps({"key": full[i % 64], "value": value})
        )
        r.raise_for_status()

    async def raw_get(i: int) -> None:
        r = await client.post(url + "/v3/kv/range", content=json.dumps({"key": full[i % 64]}))
        r.json()

    mod = {"rev": 0}

    async def raw_txn(i: int) -> None:
        body = {
            "compare": [
                {
                    "key": full[0],
                    "target": "MOD",
                    "result": "EQUAL",
                    "mod_revision": str(mod["rev"]),
                }
            ],
            "success": [{"request_put": {"key": full[0], "value": value}}],
            "failure": [{"request_range": {"key": full[0]}}],
        }
        reply = (await client.post(url + "/v3/kv/txn", content=json.dumps(body))).json()
        if reply.get("succeeded"):
            mod["rev"] = int(reply["header"]["revision"])
        else:
            kvs = reply["responses"][0]["response_range"].get("kvs") or []
            mod["rev"] = int(kvs[0]["mod_revision"]) if kvs else 0

    figures: dict[str, float] = {}
    try:
        for key in KEYS:
            await registry.put(key, VALUE)
        pairs: list[Pair] = [
            ("put", lambda i: registry.put(KEYS[i % 64], VALUE), raw_put),
            ("get", lambda i: registry.get(KEYS[i % 64]), raw_get),
            ("txn", guarded_txn(registry), raw_txn),
        ]
        measured = await measure_pairs(seconds, pairs, rounds)
        ours, base = measured.ours, measured.base
        ours["concurrent_put"] = base["concurrent_put"] = 0.0
        for _ in range(rounds):
            ours["concurrent_put"] = max(
                ours["concurrent_put"],
                await rate_concurrent(seconds, lambda i: registry.put(KEYS[i % 64], VALUE)),
            )
            base["concurrent_put"] = max(
                base["concurrent_put"], await rate_concurrent(seconds, raw_put)
            )
        for name in ours:
            figures[f"etcd_{name}_per_s"] = round(ours[name])
            figures[f"etcd_raw_{name}_per_s"] = round(base[name])
            figures[f"etcd_{name}_ratio"] = round(ours[name] / base[name], 2)
        for name in measured.ratio_median:  # (etcd's CPU is spent in another process)
            figures[f"etcd_{name}_ratio_median"] = round(measured.ratio_median[name], 2)
    finally:
        await registry.delete("", prefix=True)
        await registry.aclose()
        await client.aclose()
    return figures


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_etcd(directory: str) -> tuple[subprocess.Popen[bytes], str] | None:
    binary = shutil.which("etcd")
    if binary is None:
        return None
    client, peer = free_port(), free_port()
    process = subprocess.Popen(
        [
            binary,
            "--name",
            "bench",
            "--data-dir",
            os.path.join(directory, "etcd"),
            "--listen-client-urls",
            f"http://127.0.0.1:{client}",
            "--advertise-client-urls",
            f"http://127.0.0.1:{client}",
            "--listen-peer-urls",
            f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{peer}",
            "--initial-cluster",
            f"bench=http://127.0.0.1:{peer}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(100):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{client}/health", timeout=1):
                return process, f"127.0.0.1:{client}"
        except OSError:
            time.sleep(0.1)
    process.terminate()
    process.wait()
    return None


# --------------------------------------------------------------------- main


async def bench_memory(seconds: float) -> dict[str, float]:
    registry = MemoryRegistry()
    put = (await rate_async(seconds, lambda i: registry.put(KEYS[i % 64], VALUE))).per_s
    get = (await rate_async(seconds, lambda i: registry.get(KEYS[i % 64]))).per_s
    txn = (await rate_async(seconds, guarded_txn(registry))).per_s
    return {
        "memory_put_per_s": round(put),
        "memory_get_per_s": round(get),
        "memory_txn_per_s": round(txn),
    }


async def main(
    seconds: float, rounds: int, etcd: str | None, only: str | None = None
) -> dict[str, float]:
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="corral-bench-") as directory:
        if only in (None, "memory"):
            figures.update(await bench_memory(seconds / 2))
        if only in (None, "sqlite"):
            figures.update(await bench_sqlite(seconds, rounds, directory, "NORMAL"))
        if only not in (None, "etcd"):
            figures["load_average"] = round(os.getloadavg()[0], 2)
            return figures
        started = None
        if etcd is None:
            started = start_etcd(directory)
            etcd = started[1] if started else None
        try:
            if etcd is not None:
                figures.update(await bench_etcd(seconds, rounds, etcd))
            else:
                print("etcd: not measured (no --etcd, CORRAL_TEST_ETCD, or etcd on PATH)")
        finally:
            if started is not None:
                started[0].terminate()
                started[0].wait()
    figures["load_average"] = round(os.getloadavg()[0], 2)
    return figures


def table(figures: dict[str, float]) -> None:
    print(
        f"{'backend':8} {'figure':16} {'ours/s':>10} {'raw/s':>10} {'ratio':>6} {'median':>6} "
        f"{'cpu us':>7} {'raw cpu':>7} {'cpu ratio':>9}"
    )
    for backend in ("sqlite", "etcd"):
        for name in ("put", "get", "txn", "concurrent_put"):
            if f"{backend}_{name}_ratio" in figures:
                print(
                    f"{backend:8} {name:16} {figures[f'{backend}_{name}_per_s']:>10} "
                    f"{figures[f'{backend}_raw_{name}_per_s']:>10} "
                    f"{figures[f'{backend}_{name}_ratio']:>6} "
                    f"{figures.get(f'{backend}_{name}_ratio_median', '-'):>6} "
                    f"{figures.get(f'{backend}_{name}_cpu_us', '-'):>7} "
                    f"{figures.get(f'{backend}_raw_{name}_cpu_us', '-'):>7} "
                    f"{figures.get(f'{backend}_{name}_cpu_ratio', '-'):>9}"
                )
    for name in ("put", "get", "txn"):
        if f"memory_{name}_per_s" in figures:
            print(
                f"{'memory':8} {name:16} {figures[f'memory_{name}_per_s']:>10} {'-':>10} {'-':>6}"
            )
    print("ratio: best round / best round; median: of each round's own ratio;")
    print("cpu: this process's CPU time per operation, least of the rounds (raw cpu / ours)")
    print(f"load average (1 min): {figures['load_average']}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=None, help="per measurement window")
    parser.add_argument("--etcd", default=os.environ.get("CORRAL_TEST_ETCD"))
    parser.add_argument("--only", choices=("memory", "sqlite", "etcd"), help="one backend")
    parser.add_argument(
        "--quick", action="store_true", help=f"{QUICK_SECONDS} s windows, {QUICK_ROUNDS} rounds"
    )
    args = parser.parse_args()
    seconds = args.seconds or (QUICK_SECONDS if args.quick else 0.25)
    rounds = QUICK_ROUNDS if args.quick else ROUNDS
    results = trio.run(main, seconds, rounds, args.etcd, args.only)
    table(results)
    print(json.dumps(results), file=sys.stdout)
