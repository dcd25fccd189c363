"""Auto-picked ports for local children: free, distinct, outside the kernel's ephemeral range (where an
outgoing connection can take a free port before the child binds it)."""
import random
import socket

from dayzero.serving.launch import PortPicker, _ephemeral_low, free_port


def test_ports_are_distinct_bindable_and_below_the_ephemeral_range():
    pick = PortPicker(rng=random.Random(3))
    ports = [pick() for _ in range(50)]
    assert len(set(ports)) == 50
    low = _ephemeral_low()
    if low - 1 - PortPicker.LOWEST >= 1000:
        assert all(PortPicker.LOWEST <= p < low for p in ports)
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[0]))


def test_a_taken_port_is_never_handed_out():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        class AlwaysTaken(random.Random):   # test double: every random draw is the taken port
            def randint(self, a, b):
                return port

        got = PortPicker(rng=AlwaysTaken())()
        assert got != port
    assert isinstance(free_port(), int)
