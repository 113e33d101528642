"""Agent access to memory: the MCP server (``memworker mcp``) and the HTTP API
(``memworker serve``), both thin over one definition of the tools (``tools``).

Owns nothing but the translation: each tool's name, description and argument model (its JSON
Schema), the scope a server is configured with (the project, and optionally one user), and
how a failure becomes one line and a status. Every call goes through ``worker.Memory`` or
``WorkingMemory``, the same code Python users and the CLI run.
"""
