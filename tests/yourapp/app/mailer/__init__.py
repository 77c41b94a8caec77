"""A small welcome-mail service: the app docs/your-app.md deploys (its test runs the guide on it)."""
