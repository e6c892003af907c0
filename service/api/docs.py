"""The readable API reference at ``/api/v1/docs``, rendered on the server from the OpenAPI spec.

No JavaScript and no CDN: the page works offline and in any browser, and lists every path,
method, parameter, request body, response and error that ``/api/v1/openapi.json`` declares.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, render_template

from service.extensions import current_api

bp = Blueprint("docs", __name__, url_prefix="/api/v1")

METHOD_ORDER = ("get", "post", "put", "patch", "delete")


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def describe_schema(schema: dict[str, Any] | None) -> dict[str, Any]:
    """A short type description of a schema object: its name if a $ref, else its type."""
    if not schema:
        return {"text": "", "ref": None}
    if "$ref" in schema:
        name = _ref_name(schema["$ref"])
        return {"text": name, "ref": name}
    if schema.get("type") == "array":
        inner = describe_schema(schema.get("items"))
        return {"text": f"array of {inner['text']}", "ref": inner["ref"]}
    if "allOf" in schema and schema["allOf"]:
        return describe_schema(schema["allOf"][0])
    text = schema.get("type", "object")
    if schema.get("format"):
        text += f" ({schema['format']})"
    if schema.get("enum"):
        text += ": one of " + ", ".join(map(str, schema["enum"]))
    return {"text": text, "ref": None}


def build_reference(spec: dict[str, Any]) -> dict[str, Any]:
    operations = []
    for path in sorted(spec.get("paths", {})):
        item = spec["paths"][path]
        shared_params = item.get("parameters", [])
        for method in METHOD_ORDER:
            op = item.get(method)
            if op is None:
                continue
            params = [
                {
                    "name": p.get("name"),
                    "in": p.get("in"),
                    "required": p.get("required", False),
                    "type": describe_schema(p.get("schema")),
                    "description": p.get("description", ""),
                }
                for p in [*shared_params, *op.get("parameters", [])]
            ]
            body = op.get("requestBody")
            bodies = []
            if body:
                for ctype, media in body.get("content", {}).items():
                    bodies.append(
                        {"content_type": ctype, "type": describe_schema(media.get("schema"))}
                    )
            responses = []
            for code, resp in sorted(op.get("responses", {}).items()):
                content = resp.get("content", {})
                responses.append(
                    {
                        "code": code,
                        "description": resp.get("description", ""),
                        "content": [
                            {"content_type": ct, "type": describe_schema(m.get("schema"))}
                            for ct, m in content.items()
                        ],
                    }
                )
            operations.append(
                {
                    "path": path,
                    "method": method.upper(),
                    "anchor": f"{method}-{path}".replace("/", "-")
                    .replace("{", "")
                    .replace("}", ""),
                    "summary": op.get("summary", ""),
                    "description": op.get("description", ""),
                    "tags": op.get("tags", []),
                    "auth": bool(op.get("security")),
                    "parameters": params,
                    "body": bodies,
                    "body_required": bool(body and body.get("required")),
                    "body_description": (body or {}).get("description", ""),
                    "responses": responses,
                }
            )
    schemas = []
    for name, schema in sorted(spec.get("components", {}).get("schemas", {}).items()):
        required = set(schema.get("required", []))
        schemas.append(
            {
                "name": name,
                "description": schema.get("description", ""),
                "properties": [
                    {
                        "name": prop,
                        "type": describe_schema(sub),
                        "required": prop in required,
                        "description": sub.get("description", ""),
                        "read_only": sub.get("readOnly", False),
                    }
                    for prop, sub in schema.get("properties", {}).items()
                ],
            }
        )
    return {"info": spec.get("info", {}), "operations": operations, "schemas": schemas}


@bp.get("/docs")
def docs_page() -> str:
    spec = current_api().spec.to_dict()
    return render_template("api_docs.html", ref=build_reference(spec), spec=spec)
