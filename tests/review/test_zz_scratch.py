import sqlalchemy as sa
from bridge.lifecycle.verify import verify, status

def test_interrupted(make):
    b = make(batch_size=512)
    b.insert(b.ready(3000))
    r = b.runner()
    r.check()
    r.run_pass("MQueue1"); r.run_pass("MQueue1")
    with r.target_engine.connect() as c:
        cp = r.state.read_checkpoints(c, "job1")["MQueue1"]
    print("cp", cp.high)
    res = r.run_range("MQueue1", cp.high, 2048)
    res = r.run_range("MQueue1", 2500, 2700)
    # delete a recorded row past the checkpoint, and an unrecorded one
    t = b.tables["MQueue1"]
    with b.source.begin() as conn:
        conn.execute(t.delete().where(t.c.id.in_([1500, 2049, 2600])))
    books = verify(b.runner())
    [q] = books.queues
    print(q)
    st = status(b.runner())
    print(st["queues"][0]["backlog"], st["rows_moved"], st["queues"][0]["lag_seconds"])
    assert q.missing == 0
