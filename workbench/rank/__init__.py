"""Code that runs inside a rank process, and :mod:`.protocol`, the messages between the ranks and the supervisor
(it lives here: rank code may not import the supervisor). Nothing here imports the supervisor, the Lab panel or
plots."""
