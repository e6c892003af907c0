"""What an administrator pastes into an LMS to register kgrade (``kgrade lti config``)."""

from __future__ import annotations

from typing import Any

SCOPES = [
    "https://purl.imsglobal.org/spec/lti-ags/scope/lineitem",
    "https://purl.imsglobal.org/spec/lti-ags/scope/lineitem.readonly",
    "https://purl.imsglobal.org/spec/lti-ags/scope/result.readonly",
    "https://purl.imsglobal.org/spec/lti-ags/scope/score",
    "https://purl.imsglobal.org/spec/lti-nrps/scope/contextmembership.readonly",
]

DESCRIPTION = (
    "Quizzes and GPU-graded kernel exercises on long-context attention (Ring Attention, "
    "Native Sparse Attention), with grades in the gradebook."
)


def urls(base: str) -> dict[str, str]:
    base = base.rstrip("/")
    return {
        "tool_url": f"{base}/lti/launch",
        "login_url": f"{base}/lti/login",
        "launch_url": f"{base}/lti/launch",
        "deep_linking_url": f"{base}/lti/launch",
        "jwks_url": f"{base}/lti/jwks",
        "canvas_json_url": f"{base}/lti/canvas.json",
        "domain": base.split("://", 1)[-1].split("/", 1)[0],
    }


def canvas_key(base: str) -> dict[str, Any]:
    """Canvas developer key, LTI key, "Paste JSON" (or "Enter URL" with ``/lti/canvas.json``)."""
    u = urls(base)
    return {
        "title": "kgrade",
        "description": DESCRIPTION,
        "oidc_initiation_url": u["login_url"],
        "target_link_uri": u["launch_url"],
        "public_jwk_url": u["jwks_url"],
        "scopes": SCOPES,
        "custom_fields": {"kgrade_due": "$Canvas.assignment.dueAt.iso8601"},
        "extensions": [
            {
                "domain": u["domain"],
                "tool_id": "kgrade",
                "platform": "canvas.instructure.com",
                "privacy_level": "public",
                "settings": {
                    "text": "kgrade",
                    "placements": [
                        {
                            "placement": "assignment_selection",
                            "message_type": "LtiDeepLinkingRequest",
                            "target_link_uri": u["deep_linking_url"],
                        },
                        {
                            "placement": "link_selection",
                            "message_type": "LtiDeepLinkingRequest",
                            "target_link_uri": u["deep_linking_url"],
                        },
                        {
                            "placement": "course_navigation",
                            "message_type": "LtiResourceLinkRequest",
                            "target_link_uri": u["launch_url"],
                            "default": "disabled",
                        },
                    ],
                },
            }
        ],
    }


def moodle_fields(base: str) -> list[tuple[str, str]]:
    """Site administration > Plugins > Activity modules > External tool > Manage tools >
    configure a tool manually: each field and its value."""
    u = urls(base)
    return [
        ("Tool name", "kgrade"),
        ("Tool URL", u["tool_url"]),
        ("Tool description", DESCRIPTION),
        ("LTI version", "LTI 1.3"),
        ("Public key type", "Keyset URL"),
        ("Public keyset", u["jwks_url"]),
        ("Initiate login URL", u["login_url"]),
        ("Redirection URI(s)", u["launch_url"]),
        ("Default launch container", "Embed, without blocks"),
        ("Supports Deep Linking (Content-Item Message)", "yes"),
        ("Content Selection URL", u["deep_linking_url"]),
        (
            "IMS LTI Assignment and Grade Services",
            "Use this service for grade sync and column management",
        ),
        (
            "IMS LTI Names and Role Provisioning",
            "Use this service to retrieve members' information as per privacy settings",
        ),
        ("Share launcher's name with tool", "Always"),
        ("Share launcher's email with tool", "Always"),
        ("Accept grades from the tool", "Always"),
    ]


def text(base: str) -> str:
    """The whole of ``kgrade lti config``: URLs, Moodle's form, Canvas's JSON, then the command
    that registers the platform's side with kgrade."""
    import json

    u = urls(base)
    width = max(len(k) for k, _ in moodle_fields(base))
    lines = [
        "kgrade as an LTI 1.3 tool",
        "",
        f"  Login (OIDC initiation) URL  {u['login_url']}",
        f"  Launch / redirect URL        {u['launch_url']}",
        f"  Deep linking URL             {u['deep_linking_url']}",
        f"  Public keyset (JWKS) URL     {u['jwks_url']}",
        "",
        "Moodle: Site administration > Plugins > Activity modules > External tool > Manage tools",
        "        > configure a tool manually",
        "",
        *(f"  {k.ljust(width)}  {v}" for k, v in moodle_fields(base)),
        "",
        "  Then open the tool's 'View configuration details' and register what Moodle shows:",
        "",
        "Canvas: Admin > Developer Keys > + Developer Key > LTI Key > Method: Paste JSON",
        f"        (or Enter URL: {u['canvas_json_url']}); then turn the key ON, and add the",
        "        tool by Client ID under Settings > Apps. Paste:",
        "",
        json.dumps(canvas_key(base), indent=2),
        "",
        "Register the platform with kgrade (values from the LMS):",
        "",
        "  kgrade lti register --issuer ISSUER --client-id CLIENT_ID --deployment DEPLOYMENT_ID \\",
        "      --login-url PLATFORM_AUTH_URL --token-url PLATFORM_TOKEN_URL --jwks-url PLATFORM_JWKS_URL",
        "",
        "  Moodle:  issuer = Platform ID, login = Authentication request URL, token = Access token URL,",
        "           jwks = Public keyset URL, client id and deployment id as shown.",
        "  Canvas:  issuer https://canvas.instructure.com, login",
        "           https://sso.canvaslms.com/api/lti/authorize_redirect, token",
        "           https://sso.canvaslms.com/login/oauth2/token, jwks",
        "           https://sso.canvaslms.com/api/lti/security/jwks (self-hosted: your host);",
        "           client id = the developer key's id, deployment id from the tool's settings.",
    ]
    return "\n".join(lines) + "\n"
