"""The wire types: each route's request body, read and type-checked, and the fields they
share."""
