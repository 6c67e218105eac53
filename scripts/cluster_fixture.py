"""Three `cairn serve` processes on loopback, for the scripts that check published clients
against a cluster (`python-cluster-check.py`, `cli-cluster-check.py`).

`start_cluster` writes three node configurations (free loopback ports, the data under
`workdir`), starts the nodes with every inherited CAIRN_* variable cleared and the root
password set, and waits until each prints its readiness line. `stop_cluster` stops the
nodes still running with SIGTERM and requires a clean exit from each.
"""

import os
import socket
import subprocess
import sys
import time

READY_WITHIN_S = 60


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


def start_cluster(binary, workdir, password, secret):
    """The nine ports (tcp 0..3, http 3..6, replica 6..9) and the three processes."""
    ports = free_ports(9)
    node_list = "".join(
        f'[[cluster.nodes]]\nid = {i + 1}\ntcp = "127.0.0.1:{ports[i]}"\n'
        f'http = "127.0.0.1:{ports[3 + i]}"\nreplica = "127.0.0.1:{ports[6 + i]}"\n'
        for i in range(3)
    )
    processes = []
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAIRN_")}
    env["CAIRN_ROOT_PASSWORD"] = password
    for i in range(3):
        config = os.path.join(workdir, f"node-{i + 1}.toml")
        with open(config, "w") as f:
            f.write(
                f'data_dir = "{os.path.join(workdir, f"data-{i + 1}")}"\n[cluster]\nnode_id = {i + 1}\n'
                f'secret = "{secret}"\n{node_list}'
            )
        processes.append(
            subprocess.Popen(
                [binary, "serve", "--config", config],
                stdout=open(os.path.join(workdir, f"out-{i + 1}.log"), "w"),
                stderr=open(os.path.join(workdir, f"err-{i + 1}.log"), "w"),
                env=env,
            )
        )
    deadline = time.time() + READY_WITHIN_S
    while True:
        ready = [
            "CAIRN_READY" in open(os.path.join(workdir, f"out-{i + 1}.log")).read()
            for i in range(3)
        ]
        if all(ready):
            return ports, processes
        if time.time() > deadline or any(p.poll() is not None for p in processes):
            raise SystemExit(f"the nodes did not all print CAIRN_READY: {ready}")
        time.sleep(0.1)


def stop_cluster(workdir, processes):
    """SIGTERM every node still running; exit with the logs unless each stopped cleanly."""
    running = [(i, p) for i, p in enumerate(processes) if p.poll() is None]
    for _, process in running:
        process.terminate()
    codes = [process.wait(timeout=60) for _, process in running]
    if any(code != 0 for code in codes):
        for i, _ in running:
            sys.stderr.write(open(os.path.join(workdir, f"err-{i + 1}.log")).read()[-4000:])
        raise SystemExit(f"the nodes did not stop cleanly: exit codes {codes}")
