"""The wire form: JSON Schemas, golden vectors, and (later) the HTTP service and client."""
