"""``python -m verl_evidence.local.smoke prepare METHOD`` (what the recipes call)."""

from verl_evidence.local.smoke.cli import main

raise SystemExit(main())
