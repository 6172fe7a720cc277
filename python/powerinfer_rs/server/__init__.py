"""An OpenAI-compatible HTTP server for one :class:`~powerinfer_rs.Engine`
(``python -m powerinfer_rs serve``; needs the ``server`` extra: starlette, uvicorn, pydantic).

``app`` (routes, API key, parsing), ``schemas`` (request bodies), ``worker`` (the bounded queue
and the thread that runs one request at a time), ``responses`` (OpenAI's response shapes),
``sse`` (streaming, disconnects), ``errors`` (OpenAI's error shape), ``cli`` (the command).
Nothing here is imported by ``import powerinfer_rs``."""
