"""A port for a server a test starts: below the kernel's ephemeral range (as runner's launcher chooses the job's
store port), since every outgoing connection and port-0 bind on the host is given a port from that range, so one found
free there can be taken before the server binds it."""
import random
import socket


def free_port(host="127.0.0.1"):
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_start = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_start = 32768
    high = ephemeral_start - 1
    low = max(1024, high - 10000)
    candidates = random.sample(range(low, high + 1), min(100, high - low + 1)) if high > low else []
    for port in candidates + [0]:
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError(f"no free port on {host}")
