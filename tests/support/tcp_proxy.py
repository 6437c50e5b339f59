"""A TCP proxy between sites for keep-alive and fault tests: counts connections, cuts links, drops answers."""

from __future__ import annotations

import contextlib
import random
import socket
import threading


class TcpProxy:
    """Forwards 127.0.0.1:<port> to ``target``.

    ``connections`` counts accepted TCP connections. :meth:`cut` refuses connections and breaks open ones
    until :meth:`restore`. With ``drop_answers`` set to a fraction, that share of the chunks coming back from
    the target (the HTTP answers) is thrown away and the connection closed: the request arrived, the sender
    never learns it. :meth:`retarget` sends new connections to another server.
    """

    def __init__(
        self, target: tuple[str, int], *, seed: int = 7, avoid: frozenset[int] = frozenset()
    ) -> None:
        self.target = target
        self.connections = 0
        self.dropped_answers = 0
        self.drop_answers = 0.0
        self._rng = random.Random(seed)
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self.port = self._listen(0)
        # Ports chosen for processes not started yet are free now, so the system may hand one to us.
        while self.port in avoid:
            self.cut()
            self.port = self._listen(0)

    def _listen(self, port: int) -> int:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(128)
        self._listener = listener
        threading.Thread(target=self._accept_loop, args=(listener,), daemon=True, name="tcp proxy").start()
        return int(listener.getsockname()[1])

    def _accept_loop(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self.connections += 1
                self._open.update((client, upstream))
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, answers: bool) -> None:
        try:
            while data := source.recv(65536):
                if answers and self.drop_answers and self._rng.random() < self.drop_answers:
                    with self._lock:
                        self.dropped_answers += 1
                    break
                sink.sendall(data)
        except OSError:
            pass
        finally:
            self._close(source, sink)

    def _close(self, *sockets: socket.socket) -> None:
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        with self._lock:
            self._open.difference_update(sockets)

    def cut(self) -> None:
        """Refuse new connections and break the open ones."""
        if self._listener is not None:
            # close() alone leaves a thread blocked in accept() listening; shutdown() wakes it up.
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            sockets = list(self._open)
        self._close(*sockets)

    def retarget(self, target: tuple[str, int]) -> None:
        """Forward new connections to ``target``; open ones carry on with the old target until they close."""
        self.target = target

    def restore(self) -> None:
        """Accept connections again, on the same port."""
        if self._listener is None:
            self._listen(self.port)

    def close(self) -> None:
        self.cut()
