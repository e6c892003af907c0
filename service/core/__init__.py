"""The service layer: what the REST API, the pages and LTI all do, without HTTP.

Functions here take a database session and the acting person (``service.auth.Principal``) and
return plain objects or dicts; they raise ``ServiceError`` for anything the caller must be
told. The API (``service/api``) and the pages (``service/web``) are thin adapters over them, and
LTI (``service/lti``) builds on them; nothing here imports those packages.
"""
