"""Where frames go: the async relay sink (SSE to a client), collect, callback, null."""
