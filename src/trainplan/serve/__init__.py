"""``trainplan serve``: a local planning page over the same engine as the CLI (FastAPI, the ``serve`` extra).

:func:`trainplan.serve.forms.answer` is the engine call (no web framework needed);
:func:`trainplan.serve.app.create_app` wraps it in the web app.
"""
