"""Who am I: lets a new user check their token before taking a quiz."""

from __future__ import annotations

from flask.views import MethodView
from marshmallow import Schema, fields

from service.api.common import Blueprint, endpoint
from service.auth import current_principal

blp = Blueprint("meta", __name__, url_prefix="/api/v1", description="The calling token.")


class WhoAmISchema(Schema):
    name = fields.String(required=True)
    role = fields.String(required=True, metadata={"enum": ["instructor", "student"]})


@blp.route("/whoami")
class WhoAmI(MethodView):
    @endpoint(blp, roles=("instructor", "student"))
    @blp.response(200, WhoAmISchema)
    def get(self) -> dict[str, str]:
        """Show the calling token's name and role"""
        p = current_principal()
        return {"name": p.name, "role": p.role}
