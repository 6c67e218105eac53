#!/usr/bin/env python3
"""The published Python SDK (apache-iggy 0.9.0) against a three-node Cairn cluster.

Starts three `cairn serve` processes on loopback ports (a temporary directory holds their
configuration files and data), then through a follower: signs in (the SDK follows the
leader command 12 names), creates a stream and a topic, sends ten messages, polls them in
two pages with auto-commit (the SDK's poll routing: commands 103, 14 and 104), and checks
the second page continues at the stored offset. Stops the nodes with SIGTERM and requires a
clean exit from each.

Usage: python3 scripts/python-cluster-check.py [path/to/cairn]   (default target/debug/cairn)
Run by .ci/run after `cargo test`, which builds the binary; needs `apache-iggy==0.9.0`.
"""

import asyncio
import sys
import tempfile

import apache_iggy as iggy
from cluster_fixture import start_cluster, stop_cluster

PASSWORD = "cairn-python-Check-1"


async def exercise(tcp_port):
    # Through node 2; the root user exists once the first metadata primary made it.
    last = None
    for _ in range(150):
        try:
            client = iggy.IggyClient(f"127.0.0.1:{tcp_port}")
            await client.connect()
            await client.login_user("iggy", PASSWORD)
            break
        except Exception as error:  # noqa: BLE001 - retried until the bound
            last = error
            await asyncio.sleep(0.2)
    else:
        raise SystemExit(f"could not sign in through a follower: {last}")
    await client.create_stream("python")
    await client.create_topic("python", "checks", 2)
    await client.send_messages(
        "python",
        "checks",
        iggy.Partitioning.partition_id(0),
        [iggy.SendMessage(f"message {i}") for i in range(10)],
    )
    consumer = iggy.Consumer.Single(7)
    pages = []
    for _ in range(2):
        polled = await client.poll_messages(
            "python",
            "checks",
            consumer=consumer,
            polling_strategy=iggy.PollingStrategy.Next(),
            count=5,
            auto_commit=True,
            partition_id=0,
        )
        pages.append([(m.offset(), bytes(m.payload()).decode()) for m in polled])
    expected = [[(i, f"message {i}") for i in range(5)], [(i, f"message {i}") for i in range(5, 10)]]
    if pages != expected:
        raise SystemExit(f"polled {pages}, expected {expected}")


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else "target/debug/cairn"
    with tempfile.TemporaryDirectory(prefix="cairn-python-") as workdir:
        ports, processes = start_cluster(binary, workdir, PASSWORD, "the python check shared secret")
        try:
            asyncio.run(exercise(ports[1]))
        finally:
            stop_cluster(workdir, processes)
    print("python SDK against a three-node cluster: sign-in through a follower, create, send, routed polls with auto-commit: ok")


if __name__ == "__main__":
    main()
