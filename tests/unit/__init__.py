"""The fast layer: pure logic, fakes for the OS seams, real files, sockets and child
processes; no MLX ranks."""
