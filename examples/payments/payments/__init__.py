"""A payments service: the small Celery app docs/your-app.md puts under taskherd, step by step."""
