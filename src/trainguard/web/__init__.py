"""The dashboard (`trainguard serve`): a read-only web view of run directories and the fleet database.

`catalog` finds runs and caches their reports, `app` is the ASGI application, `render` holds the
templates and the inlined plotting library (also used by ``trainguard report --html``). docs/dashboard.md.
"""
