"""verl tools of this project: ``search`` over the retrieval server (:mod:`.search_tool`)."""
