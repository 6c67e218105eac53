#!/usr/bin/env python3
"""The published CLI (iggy-cli 0.14.0) against a three-node Cairn cluster.

Starts three `cairn serve` processes on loopback (`cluster_fixture.py`), then runs `iggy`
commands through the two followers: signs in (the CLI's SDK follows the leader command 12
names), creates a stream, a topic and a consumer group, sends messages through one
follower and polls them through the other, stores a consumer offset through one and reads
it back through the other, and checks the cluster metadata names three nodes and one
leader. Then SIGKILLs the leader and checks that a message sent through a survivor is
polled back through the other, and that the metadata names a new leader. Stops the
survivors with SIGTERM and requires a clean exit from each.

Usage: python3 scripts/cli-cluster-check.py path/to/cairn path/to/iggy
Run by .ci/run after `cargo test`, which builds the server; .ci/run installs the CLI.
"""

import os
import subprocess
import sys
import tempfile
import time

from cluster_fixture import start_cluster, stop_cluster

PASSWORD = "cairn-cli-Check-1"
WITHIN_S = 30


def cli(iggy, tcp_port, *args, retry=False):
    """Run `iggy` against the node at `tcp_port`; its standard output. With `retry`, a
    failure is retried for up to WITHIN_S (the root user, or a new leader, may not be there
    yet)."""
    command = [
        iggy,
        "--tcp-server-address",
        f"127.0.0.1:{tcp_port}",
        "--username",
        "iggy",
        "--password",
        PASSWORD,
        *args,
    ]
    deadline = time.time() + WITHIN_S
    while True:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode == 0:
            return done.stdout
        if not retry or time.time() > deadline:
            raise SystemExit(f"`iggy {' '.join(args)}` through port {tcp_port} failed:\n{done.stdout}\n{done.stderr}")
        time.sleep(0.3)


def leaders(metadata):
    """The names of the nodes the metadata table gives the role leader, and the rows."""
    rows = [line for line in metadata.splitlines() if "cairn-" in line]
    names = [row.split("|")[1].strip() for row in rows if "| leader" in row]
    return names, rows


def exercise(iggy, ports, processes):
    tcp = ports[:3]
    cli(iggy, tcp[1], "ping", retry=True)
    cli(iggy, tcp[1], "stream", "create", "cli")
    cli(iggy, tcp[2], "topic", "create", "cli", "checks", "2", "none")
    cli(iggy, tcp[2], "consumer-group", "create", "cli", "checks", "readers")
    cli(iggy, tcp[2], "message", "send", "--partition-id", "0", "cli", "checks", "first", "second")
    polled = cli(iggy, tcp[1], "message", "poll", "--message-count", "10", "--first", "cli", "checks", "0")
    if "first" not in polled or "second" not in polled:
        raise SystemExit(f"the messages sent through one follower are not polled through the other:\n{polled}")
    cli(iggy, tcp[2], "consumer-offset", "set", "c1", "cli", "checks", "0", "1")
    stored = cli(iggy, tcp[1], "consumer-offset", "get", "c1", "cli", "checks", "0")
    if not any(line.startswith("| Stored offset") and "| 1" in line for line in stored.splitlines()):
        raise SystemExit(f"the stored offset does not read back through the other follower:\n{stored}")
    names, rows = leaders(cli(iggy, tcp[1], "cluster", "metadata"))
    if len(rows) != 3 or len(names) != 1:
        raise SystemExit(f"cluster metadata: {rows}")
    leader = int(names[0].removeprefix("cairn-")) - 1
    processes[leader].kill()
    processes[leader].wait(timeout=60)
    survivors = [index for index in range(3) if index != leader]
    cli(iggy, tcp[survivors[0]], "message", "send", "--partition-id", "1", "cli", "checks", "after-the-kill", retry=True)
    polled = cli(iggy, tcp[survivors[1]], "message", "poll", "--message-count", "10", "--first", "cli", "checks", "1", retry=True)
    if "after-the-kill" not in polled:
        raise SystemExit(f"a message sent after the leader's death is not polled back:\n{polled}")
    deadline = time.time() + WITHIN_S
    while True:
        names, rows = leaders(cli(iggy, tcp[survivors[1]], "cluster", "metadata", retry=True))
        if len(names) == 1 and names[0] != f"cairn-{leader + 1}":
            break
        if time.time() > deadline:
            raise SystemExit(f"no new leader named after the leader's death: {rows}")
        time.sleep(0.3)


def main():
    if len(sys.argv) != 3:
        raise SystemExit("usage: cli-cluster-check.py path/to/cairn path/to/iggy")
    binary, iggy = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory(prefix="cairn-cli-") as workdir:
        # The CLI keeps its sessions in a keyring and a home directory: a scratch one.
        os.environ["HOME"] = workdir
        ports, processes = start_cluster(binary, workdir, PASSWORD, "the cli check shared secret")
        try:
            exercise(iggy, ports, processes)
        finally:
            stop_cluster(workdir, processes)
    print(
        "iggy-cli against a three-node cluster: sign-in through followers, create, send and poll "
        "through different nodes, stored offsets, cluster metadata, the leader killed: ok"
    )


if __name__ == "__main__":
    main()
