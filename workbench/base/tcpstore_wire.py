"""torch's ``TCPStore`` wire protocol, the part both sides here speak: the run's own store server
(:mod:`workbench.supervisor.store`) and a joining rank's first queries (:mod:`workbench.rank.join`). Each query is a
command byte, then its fields; integers in the machine's byte order, as torch's client sends them."""

MAGIC = 0x3C85F7CE  # sent with VALIDATE: a torch TCPStore client
KEY_PREFIX = "/"  # torch's client puts this before every key it sends
(VALIDATE, SET, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, DELETE_KEY, APPEND, MULTI_GET, MULTI_SET,
 CANCEL_WAIT, PING, QUEUE_PUSH, QUEUE_POP, QUEUE_LEN, LIST_KEYS, BARRIER) = range(19)
READY, NOT_READY = 0, 1
STOP_WAITING, WAIT_CANCELED = 0, 1
