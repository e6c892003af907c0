"""Deep Linking 2.0: the instructor's pick goes back to the platform as signed content items.

Each item is an ``ltiResourceLink`` to our launch URL with a ``lineItem``, so the platform makes
the grade column, and the custom parameter ``kgrade_assignment`` naming the assignment (its
first launch binds it to the link). The response is an RS256 JWT signed with our key, POSTed by
an auto-submitting form as ``JWT`` to ``deep_link_return_url``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pylti1p3.deep_link import DeepLink
from pylti1p3.deep_link_resource import DeepLinkResource
from pylti1p3.lineitem import LineItem
from sqlalchemy.orm import Session

from service.db.courses import Assignment
from service.db.lti import LtiLaunch, LtiPlatform
from service.lti.context import ASSIGNMENT_PARAM, DUE_PARAM
from service.lti.platforms import registration

#: The line items kgrade makes carry this tag.
TAG = "kgrade"


class _Resource(DeepLinkResource):
    """pylti1p3's resource link, plus the submission window (a due date) when one is set."""

    def __init__(self, due: str | None) -> None:
        self._due = due

    def to_dict(self) -> dict[str, object]:
        out = super().to_dict()
        if self._due:
            out["submission"] = {"endDateTime": self._due}
        return out


def content_item(assignment: Assignment, launch_url: str) -> _Resource:
    line_item = (
        LineItem()
        .set_score_maximum(assignment.score_maximum)
        .set_label(assignment.title)
        .set_resource_id(assignment.line_item_resource_id)
        .set_tag(TAG)
    )
    item = _Resource(assignment.due_at.isoformat() if assignment.due_at else None)
    item.set_title(assignment.title).set_url(launch_url).set_lineitem(line_item)
    item.set_custom_params(
        {
            ASSIGNMENT_PARAM: assignment.id,
            # Platforms that know the link's due date send it here on each launch.
            DUE_PARAM: "$ResourceLink.submission.endDateTime",
        }
    )
    return item


@dataclass
class Response:
    return_url: str
    jwt: str
    claims: dict[str, Any]


def respond(
    session: Session,
    launch: LtiLaunch,
    platform: LtiPlatform,
    items: list[Assignment],
    launch_url: str,
) -> Response:
    """The signed deep-linking response for ``items`` (none: the instructor cancelled)."""
    settings = dict(launch.claims.get("deep_linking_settings") or {})
    link = DeepLink(registration(session, platform), launch.deployment_id, settings)  # type: ignore[arg-type]
    resources = [content_item(a, launch_url) for a in items]
    claims = link.get_message_jwt(resources)
    return Response(str(settings["deep_link_return_url"]), link.encode_jwt(claims), claims)


def accepts_multiple(launch: LtiLaunch) -> bool:
    raw = (launch.claims.get("deep_linking_settings") or {}).get("accept_multiple", True)
    return raw not in (False, "false")
