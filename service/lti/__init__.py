"""kgrade as an LTI 1.3 Advantage tool, on pylti1p3next (pinned) with the checks it skips.

* ``platforms``: registrations per (issuer, client_id) and their deployments; the tool config
  pylti1p3 reads. ``keys``: our key pairs, the JWKS, rotation.
* ``launch``: OIDC login initiation and launch validation; ``context``: what a launch means
  (course, user, role, assignment); ``deep_linking``: the signed content-item response.
* ``ags``: tokens, line items, scores, memberships; ``tasks``: the Celery tasks that post
  grades and read rosters; ``config``: what an administrator pastes into the LMS.
* ``views``: ``/lti/login``, ``/lti/launch``, ``/lti/jwks``, deep linking and link set-up.
"""

from __future__ import annotations

from flask import Flask


def register_lti(app: Flask) -> None:
    from service.lti.views import bp

    app.register_blueprint(bp)
