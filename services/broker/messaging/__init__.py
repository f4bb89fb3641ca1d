"""The broker's messaging services: what a request does, whatever wire it came in on.

One module per request family: send, sendback (a consumer's message given back for retry),
reply (request-reply), pull, offsets, consumers, transaction, query, admin and brokerconfig;
context holds :class:`~tidemq.broker.messaging.context.Caller`, who sent a request, for the services
that need it. A service is a plain class whose constructor takes only the collaborators it uses (the
store, the topic manager, ...) and whose operations take and give typed values: no
RemotingCommand, no Connection, no header dicts. The remoting adapters (tidemq.broker.processors)
decode a header, call a service and encode its result; the gRPC front-end to come will do the same
over protobuf. A refusal is a :class:`tidemq.errors.BrokerError` carrying the RocketMQ response code.
"""
