"""The web console (issue 15, B2, R17, R18): server-rendered pages for people at ``/``, served
by ``onward up`` and ``onward api`` beside the HTTP API.

* ``pages`` -- the routes (``router()``, included by ``onward.api.app.create_app``);
* ``auth`` -- ``/login`` with an API key, the signed session cookie, CSRF tokens;
* ``reads`` -- the run list (filters, keyset paging) and what a run's screen shows;
* ``way`` -- "way forward now": which durable row moves a run next, and when;
* ``graph`` -- an automation's graph as SVG, with a run's path and position;
* ``health`` and ``charts`` -- the R18 measurements of one organisation, the last hour as SVG;
* ``templates/`` (Jinja2) and ``static/`` (one stylesheet, a few lines of script for live
  refresh): shipped in the package, nothing from a CDN; every page reads with script off.
"""
