"""A web app that publishes: POST /orders puts the order on the ``orders`` topic.

    pip install fastapi uvicorn
    RAFTQ_URL=http://127.0.0.1:8001 uvicorn fastapi_app:app --app-dir examples

One ``AsyncClient`` for the whole app, opened and closed with it (the lifespan); requests share
it, and concurrent publishes share batch requests. The answer is sent once the order is
committed on a majority of the nodes: a 201 means it will not be lost.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

from raftq.client import AsyncClient, RaftqError, TopicFull

TOPIC = os.environ.get("ORDERS_TOPIC", "orders")


class Order(BaseModel):
    id: int
    amount: int


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    urls = os.environ.get("RAFTQ_URL", "http://127.0.0.1:8001").split(",")
    async with AsyncClient(urls, timeout=10.0) as client:
        await client.create_topic(TOPIC, if_not_exists=True)
        app.state.raftq = client
        yield


app = FastAPI(lifespan=lifespan)


@app.post("/orders", status_code=201)
async def create_order(order: Order) -> dict[str, int]:
    client: AsyncClient = app.state.raftq
    try:
        seq = await client.publish(TOPIC, order.model_dump_json(), headers={"kind": "order"})
    except TopicFull as e:  # back-pressure: tell the caller when to come back
        headers = {"Retry-After": str(int(e.retry_after or 1))}
        raise HTTPException(503, "orders are piling up; try again", headers=headers) from e
    except RaftqError as e:
        raise HTTPException(503, f"the queue is unavailable: {e}") from e
    return {"seq": seq}
