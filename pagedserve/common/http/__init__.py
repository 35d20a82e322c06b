"""The HTTP defences the server and the router share: the listening socket's guard (a cap
on connections in all and per client, a deadline for request headers, ``100 Continue`` only
for a body within the limit), who a request comes from behind trusted proxies, and every
refusal in OpenAI's JSON error shape, the HTTP parser's own included."""
