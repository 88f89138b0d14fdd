#!/usr/bin/env python3
"""tests/guest/qmp.py: a small QMP client (python3 standard library only).

Command line (SOCK is a QEMU started with -qmp unix:SOCK,server=on,wait=off):

  qmp.py SOCK COMMAND [JSON-ARGS]       run one QMP command, print its
                                        "return" as JSON; exit 1 on an error
  qmp.py SOCK migrate URI [--max-bandwidth BYTES/S] [--downtime-limit MS]
                          [--timeout S]
                                        migrate, poll query-migrate until it
                                        ends, print one JSON line: status,
                                        downtime, total-time, setup-time (ms),
                                        ram transferred; exit 0 iff completed
  qmp.py SOCK wait-status STATUS [--timeout S]
                                        poll query-status until STATUS
                                        (e.g. running); exit 1 on timeout
  qmp.py SOCK wait-socket [--timeout S] wait until SOCK accepts a connection

From python: QMP(sock).cmd("query-status"), QMP.migrate(...).
"""
import json
import os
import socket
import sys
import time


class QMPError(Exception):
    pass


class QMP:
    def __init__(self, path, timeout=10.0):
        self.path = path
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(timeout)
        self.s.connect(path)
        self.f = self.s.makefile("r", encoding="utf-8", newline="\n")
        self.events = []
        greeting = self._read()
        if "QMP" not in greeting:
            raise QMPError(f"{path}: not a QMP greeting: {greeting}")
        self.cmd("qmp_capabilities")

    def _read(self):
        line = self.f.readline()
        if not line:
            raise QMPError(f"{self.path}: QEMU closed the QMP connection")
        return json.loads(line)

    def cmd(self, _name, **args):
        """Run _NAME with ARGS; return its "return" value or raise QMPError."""
        name = _name
        msg = {"execute": name}
        if args:
            msg["arguments"] = args
        self.s.sendall((json.dumps(msg) + "\n").encode())
        while True:
            r = self._read()
            if "event" in r:
                self.events.append(r)
                continue
            if "error" in r:
                raise QMPError(f"{name}: {r['error'].get('class')}: {r['error'].get('desc')}")
            return r.get("return")

    def close(self):
        try:
            self.f.close()
            self.s.close()
        except OSError:
            pass

    def wait_status(self, status, timeout=30.0):
        """Poll query-status until it reports STATUS; return the last one."""
        end = time.monotonic() + timeout
        while True:
            st = self.cmd("query-status")
            if st.get("status") == status or time.monotonic() > end:
                return st
            time.sleep(0.05)

    def migrate(self, uri, max_bandwidth=None, downtime_limit=None, timeout=300.0,
                poll=0.05):
        """Migrate to URI; poll query-migrate until completed/failed/cancelled
        (or TIMEOUT seconds: the migration is cancelled).  Returns a dict:
        status, downtime, total-time, setup-time (ms, None if QEMU did not
        say), ram-transferred (bytes), dirty-sync-count, error-desc."""
        params = {}
        if max_bandwidth is not None:
            params["max-bandwidth"] = int(max_bandwidth)
        if downtime_limit is not None:
            params["downtime-limit"] = int(downtime_limit)
        if params:
            self.cmd("migrate-set-parameters", **params)
        self.cmd("migrate", uri=uri)
        end = time.monotonic() + timeout
        while True:
            info = self.cmd("query-migrate")
            st = info.get("status")
            if st == "completed" and not info.get("total-time"):
                # QEMU 7.2 sets "completed" before it has computed the
                # times (migration_iteration_finish): 0 for a moment.
                if time.monotonic() < end:
                    time.sleep(0.01)
                    continue
            if st in ("completed", "failed", "cancelled"):
                break
            if time.monotonic() > end:
                try:
                    self.cmd("migrate_cancel")
                except QMPError:
                    pass
                info = dict(info, status="timeout")
                break
            time.sleep(poll)
        ram = info.get("ram", {})
        return {
            "status": info.get("status"),
            "downtime": info.get("downtime"),
            "total-time": info.get("total-time"),
            "setup-time": info.get("setup-time"),
            "ram-transferred": ram.get("transferred"),
            "dirty-sync-count": ram.get("dirty-sync-count"),
            "error-desc": info.get("error-desc"),
        }


def wait_socket(path, timeout):
    """Wait until PATH is a unix socket that accepts a connection."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if os.path.exists(path):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(path)
                return True
            except OSError:
                pass
            finally:
                s.close()
        time.sleep(0.05)
    return False


def _opt(argv, name, conv, default):
    if name in argv:
        i = argv.index(name)
        v = conv(argv[i + 1])
        del argv[i:i + 2]
        return v
    return default


def main(argv):
    if len(argv) < 2:
        sys.exit(__doc__)
    sock, what, rest = argv[0], argv[1], argv[2:]
    timeout = _opt(rest, "--timeout", float, None)
    try:
        if what == "wait-socket":
            return 0 if wait_socket(sock, timeout or 30) else 1
        q = QMP(sock)
        if what == "migrate":
            bw = _opt(rest, "--max-bandwidth", int, None)
            dl = _opt(rest, "--downtime-limit", int, None)
            if len(rest) != 1:
                sys.exit("usage: qmp.py SOCK migrate URI [--max-bandwidth B] "
                         "[--downtime-limit MS] [--timeout S]")
            r = q.migrate(rest[0], bw, dl, timeout or 300)
            print(json.dumps(r))
            return 0 if r["status"] == "completed" else 1
        if what == "wait-status":
            st = q.wait_status(rest[0], timeout or 30)
            print(json.dumps(st))
            return 0 if st.get("status") == rest[0] else 1
        args = json.loads(rest[0]) if rest else {}
        print(json.dumps(q.cmd(what, **args)))
        return 0
    except (OSError, QMPError, ValueError) as e:
        print(f"qmp.py: {sock}: {what}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
