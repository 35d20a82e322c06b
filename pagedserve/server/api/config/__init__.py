"""The server's settings and the application state every room reads."""
