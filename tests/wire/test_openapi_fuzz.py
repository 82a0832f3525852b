"""schemathesis against the service's own OpenAPI document: generated requests, in and out of the schemas, get
a documented status, a documented content type and a body its schema allows, and never a server error.

The check that every schema-valid request is accepted is left out on purpose: a request can meet its schema
and still break a rule beyond it (a profile digest that does not match, mounts that overlap), which the kit
lists and the service refuses. ``CHECKFU_SLOW=1`` runs many more examples.
"""

from __future__ import annotations

import os

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from checkfu.testing import MemoryProvider
from checkfu.wire.server import create_app

SECRET = "schemathesis-credential"
EXAMPLES = 200 if os.environ.get("CHECKFU_SLOW") == "1" else 6

schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(MemoryProvider(), [SECRET]))


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_the_service_keeps_to_its_document(case: schemathesis.Case) -> None:
    case.call_and_validate(headers={"Authorization": f"Bearer {SECRET}"}, excluded_checks=[positive_data_acceptance])
