"""The deployment search (issue 58; docs/search.md): a deployment's capacity under an SLO (``capacity``), the
criteria it is judged by (``criteria``)."""
