// A MongoDB wire-protocol server for depot's tests: mongo-java-server on its
// in-memory backend, listening on 127.0.0.1:PORT until killed. Given a FILE,
// it keeps its data there instead (the H2 MVStore backend) and survives a
// restart: MVStore commits in the background about once a second and on a
// clean stop (SIGTERM), so only a SIGKILL can lose the last second.
//
// mongo-java-server's own versions (ServerVersion) report wire versions 6 to
// 8; the Rust driver refuses servers below 9, so the backend is given a
// version that reports MongoDB 6.0, wire version 17.

import java.util.List;

import de.bwaldvogel.mongo.MongoServer;
import de.bwaldvogel.mongo.MongoVersion;
import de.bwaldvogel.mongo.backend.AbstractMongoBackend;
import de.bwaldvogel.mongo.backend.h2.H2Backend;
import de.bwaldvogel.mongo.backend.memory.MemoryBackend;

public final class MongoLauncher {
    /** MongoDB 6.0: wire version 17. */
    private static final MongoVersion MONGO_6_0 = new MongoVersion() {
        @Override
        public List<Integer> getVersionArray() {
            return List.of(6, 0, 0);
        }

        @Override
        public int getWireVersion() {
            return 17;
        }
    };

    private MongoLauncher() {}

    public static void main(String[] args) throws InterruptedException {
        if (args.length != 1 && args.length != 2) {
            System.err.println("usage: MongoLauncher PORT [FILE]");
            System.exit(2);
        }
        int port = Integer.parseInt(args[0]);
        AbstractMongoBackend backend = args.length == 2 ? new H2Backend(args[1]) : new MemoryBackend();
        MongoServer server = new MongoServer(backend.version(MONGO_6_0));
        server.bind("127.0.0.1", port);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            server.shutdownNow();
            backend.close();
        }));
        System.err.println("mongo-java-server (wire version 17) listening on 127.0.0.1:" + port
            + (args.length == 2 ? ", data in " + args[1] : ", data in memory"));
        Thread.currentThread().join();
    }
}
