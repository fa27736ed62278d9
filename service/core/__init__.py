"""Pure rules, no sockets and no threads: NFP frames (protocol), their JSON payloads (payloads),
passive keepalive state (keepalive), the error classes, and the small JSON-schema check used
for interactive input. Imports nothing from outside `core`."""
