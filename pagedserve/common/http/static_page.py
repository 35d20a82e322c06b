"""A page of static files: ``/`` is its ``index.html`` and ``/ui/NAME`` each file beside it,
as the server's and the router's pages both serve theirs, and the files both share
(``static/`` here: ``base.css``, the colours and the header)."""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

STATIC_PREFIX = "/ui/"
# The browser revalidates every time: a server upgraded in place serves its new page at once.
_NO_CACHE = {"Cache-Control": "no-cache"}
SHARED = Path(__file__).parent / "static"


def add_static_page(router: web.UrlDispatcher, folder: Path) -> None:
    """Routes ``/`` and ``/ui/{name}`` to the files in ``folder`` when the app is built, served
    by name; any other name is a 404."""
    files = {path.name: path for where in (SHARED, folder) for path in where.iterdir()
             if path.is_file()}

    async def index(request: web.Request) -> web.FileResponse:
        return web.FileResponse(files["index.html"], headers=_NO_CACHE)

    async def static_file(request: web.Request) -> web.FileResponse:
        path = files.get(request.match_info["name"])
        if path is None:
            raise web.HTTPNotFound()
        return web.FileResponse(path, headers=_NO_CACHE)

    router.add_get("/", index)
    router.add_get(STATIC_PREFIX + "{name}", static_file)
