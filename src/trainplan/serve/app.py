"""The local planning page of ``trainplan serve``: a FastAPI app (the ``serve`` extra).

Routes: ``GET /`` the page; ``GET /api/choices`` what the form offers; ``POST /api/estimate`` a form (JSON)
→ the job, its memory breakdown on the chosen GPUs and the ranked options; ``POST /api/job.yaml`` the job
file to download.  A bad value answers 422 with ``{"error": "<field>: <one line>"}`` — the job-spec code's
own message — and the server keeps serving.  Everything the page needs (plotly.js included) is served
from here: it works with no network.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainplan.errors import TrainplanError

try:  # at module level: FastAPI resolves the endpoints' (string) annotations in this module's globals
    from starlette.requests import Request
except ImportError:  # the serve extra is absent; create_app says so when it is called
    Request = Any  # type: ignore[misc, assignment]
from trainplan.serve.forms import DEFAULTS, answer, choices, job_from_form, job_yaml
from trainplan.serve.page import page_html


def _plotly_js_path() -> Path | None:
    try:
        import plotly
    except ImportError:
        return None
    path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    return path if path.exists() else None


#: The largest request body the page accepts (a pasted config.json is a few KiB).
MAX_BODY_BYTES = 256 * 1024
#: Host headers answered by default: the loopback names (a page reached through another name is refused, which
#: stops DNS rebinding: a web page cannot make the browser talk to this server under its own domain).
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")


def create_app(*, allowed_hosts: tuple[str, ...] = LOOPBACK_HOSTS) -> Any:
    """The FastAPI application (imports FastAPI here: the rest of trainplan does not need it).

    Requests whose ``Host`` is not in ``allowed_hosts`` get 400 (Starlette's ``TrustedHostMiddleware``); POST
    bodies need a ``Content-Length`` of at most :data:`MAX_BODY_BYTES` (411 / 413 otherwise).
    """
    from fastapi import Body, FastAPI
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, PlainTextResponse, Response
    from starlette.middleware.trustedhost import TrustedHostMiddleware

    from trainplan.cli.common import dump_json

    app = FastAPI(title="trainplan", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts))

    @app.middleware("http")
    async def _body_limit(request: Request, call_next: Any) -> Any:
        if request.method in ("POST", "PUT", "PATCH"):
            length = request.headers.get("content-length")
            if length is None or not length.isdigit():
                return JSONResponse({"error": "request body: a Content-Length is required"}, status_code=411)
            if int(length) > MAX_BODY_BYTES:
                return JSONResponse({"error": f"request body: larger than {MAX_BODY_BYTES // 1024} KiB"}, status_code=413)
        return await call_next(request)

    def ok(data: Any) -> Response:
        # dump_json: infinities (an option that never finishes) become null, so the answer stays valid JSON
        return Response(dump_json(data), media_type="application/json")

    def error(message: str, status: int = 422) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status)

    @app.exception_handler(TrainplanError)
    async def _user_error(request: Request, exc: TrainplanError) -> JSONResponse:
        return error(str(exc))

    @app.exception_handler(RequestValidationError)
    async def _bad_body(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        return error(f"request body: {first.get('msg', 'not a JSON object of form fields')}")

    @app.get("/", response_class=HTMLResponse)
    def index() -> str:
        return page_html(choices(), DEFAULTS)

    @app.get("/api/choices")
    def api_choices() -> Response:
        return ok({"choices": choices(), "defaults": DEFAULTS})

    async def form_of(request: Request) -> dict[str, Any]:
        """The form as JSON (what the page sends) or as an HTML form post (urlencoded or multipart)."""
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind in ("application/x-www-form-urlencoded", "multipart/form-data"):
            return {k: v for k, v in (await request.form()).items() if isinstance(v, str)}
        try:
            data = await request.json()
        except ValueError:
            raise TrainplanError("request body: not a JSON object of form fields (or an HTML form post)") from None
        if not isinstance(data, dict):
            raise TrainplanError("request body: not a JSON object of form fields")
        return data

    @app.post("/api/estimate")
    async def api_estimate(request: Request) -> Response:
        from starlette.concurrency import run_in_threadpool

        return ok(await run_in_threadpool(answer, await form_of(request)))

    @app.post("/api/job.yaml")
    def api_job_yaml(form: dict[str, Any] = Body(...)) -> PlainTextResponse:
        mapping, job = job_from_form(form)
        return PlainTextResponse(job_yaml(mapping), media_type="application/yaml",
                                 headers={"Content-Disposition": f'attachment; filename="{job.name}.yaml"'})  # fmt: skip

    @app.get("/static/plotly.min.js")
    def plotly_js() -> Response:
        path = _plotly_js_path()
        if path is None:
            return PlainTextResponse("plotly is not installed: pip install 'trainplan[serve]'", status_code=404)
        return FileResponse(path, media_type="text/javascript")

    return app
